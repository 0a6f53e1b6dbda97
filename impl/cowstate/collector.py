"""The cyclic garbage collector paused while a restore builds its tables.

A restore decodes every block of its files into columns (lists of keys,
namespaces and states: as many items as the snapshot has entries) and fills
new maps from them. Everything it allocates meanwhile counts towards the
collector's thresholds, so automatic collections run in the middle of it,
and each one traverses the columns still alive: at 1M int mappings a
restore met one young-generation collection of 20-33 ms, and a base with
10 deltas two of 10 ms, one of 20-29 ms and a full one of 15-28 ms (60-90 ms
of a 450-650 ms restore; ``bench/bench_heap_incremental.py``'s workload,
2026-11-28). None of it can free anything the restore made: its columns
and tables are acyclic and all alive until it ends.

:func:`paused_collector` turns automatic collection off for the duration of
a ``with`` block and back on after it, on every path, if it was on when the
outermost block began. The collector's state is the process's, so the pause
is counted across threads: two restores at once (several backends) pause it
once, and the last to finish turns it back on. A user's deserializer that
makes cyclic garbage during a restore leaves it to the next collection
after it. The rules:

P1. Only the outermost pause changes the collector: it records whether
    automatic collection was on and turns it off; the last pause to end
    turns it on again if it was on then, and only then.
P2. A pause ends on every path (``finally``): a refused or failed restore
    leaves the collector as it found it.
P3. Nothing is collected by a pause itself: no ``gc.collect()`` before or
    after (a full collection is a cost of its own the caller may not want).
"""

from __future__ import annotations

import gc
import threading
from collections.abc import Iterator
from contextlib import contextmanager

__all__ = ["paused_collector"]


@contextmanager
def paused_collector() -> Iterator[None]:
    """Automatic garbage collection off inside the block (P1-P3)."""
    _enter()
    try:
        yield
    finally:
        _exit()  # P2


_lock = threading.Lock()
_depth = 0
_was_enabled = False


def _enter() -> None:
    global _depth, _was_enabled
    with _lock:
        if _depth == 0:  # P1: the outermost pause
            _was_enabled = gc.isenabled()
            gc.disable()
        _depth += 1


def _exit() -> None:
    global _depth
    with _lock:
        _depth -= 1
        if _depth == 0 and _was_enabled:  # P1: the last pause to end
            gc.enable()
