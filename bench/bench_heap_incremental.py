"""Benchmark: heap incremental checkpoints (issue 29) against full ones, through
the checkpoint coordinator, in one process.

Run::

    .venv/bin/python bench/bench_heap_incremental.py            # 1,000,000 entries
    .venv/bin/python bench/bench_heap_incremental.py --quick    # 100,000 entries
    .venv/bin/python bench/bench_heap_incremental.py --entries N --deltas D

Data: one ``HeapKeyedStateBackend`` over key groups ``[0, 127]`` of max
parallelism 128, with ``incremental=True`` and tables over the default map
(the C map where built; both maps track changes), one ``ValueState`` of ``N`` int keys ``0..N-1``
mapped to ints (default serializer), loaded untimed through the table.
A *round* changes 1% of the keys (``N // 100``), drawn at random: half get a
new value, a quarter are new keys, a quarter are removed. Rows:

- full checkpoint: bytes and wall time of the first (full) checkpoint;
- delta: bytes and wall time of each of ``D`` rounds' checkpoints (mean);
- restore: wall time of restoring the checkpoint whose chain is a base and
  ``D`` deltas, beside a full checkpoint of the same contents (``force_full``);
- put with tracking off / on: ``put`` of existing keys into one default map of
  ``N // 10`` entries, no snapshot open (best of 3).

Everything lives in one temporary directory, deleted at exit; nothing is
fsync'ed. Times are the process's CPU time (``time.process_time``: the
writer thread's too), steadier than wall time on a shared VM; compare
ratios, not seconds.
"""

from __future__ import annotations

import argparse
import random
import shutil
import tempfile
import time
from typing import Any

from cowstate import CopyOnWriteStateMap
from cowstate.checkpoint import CheckpointCoordinator, CheckpointStorage, RestoreMode
from cowstate.descriptors import ValueStateDescriptor
from cowstate.heap_backend import HeapKeyedStateBackend
from cowstate.heap_incremental import IncrementalOptions
from cowstate.key_groups import KeyGroupRange
from cowstate.keyed_state import VOID_NAMESPACE
from cowstate.state_table import CopyOnWriteStateTable

MAXP = 128
VALUE: ValueStateDescriptor[Any] = ValueStateDescriptor("bench_value")


def backend(deltas: int) -> HeapKeyedStateBackend:
    made = HeapKeyedStateBackend(
        KeyGroupRange(0, MAXP - 1),
        MAXP,
        CopyOnWriteStateTable,
        incremental=IncrementalOptions(max_deltas=deltas, max_delta_ratio=10.0),
    )
    made.get_state(VALUE)
    return made


def checkpoint(coordinator: CheckpointCoordinator) -> tuple[float, int, int]:
    """CPU time, bytes written, files of one checkpoint."""
    start = time.process_time()
    done = coordinator.complete_checkpoint(coordinator.trigger_checkpoint())
    elapsed = time.process_time() - start
    handle = done.metadata.subtasks[0]
    return elapsed, handle.checkpointed_size, len(handle.files)


def restore_time(directory: str, root: str, job: str, deltas: int) -> float:
    target = backend(deltas)
    start = time.process_time()
    restored = CheckpointCoordinator.restore(
        CheckpointStorage(root, job), [target], directory, RestoreMode.NO_CLAIM
    )
    elapsed = time.process_time() - start
    restored.close()
    target.close()
    return elapsed


def put_rate(n: int, tracking: bool) -> float:
    """Puts per second into a default map of ``n`` entries (best of 3)."""
    m: CopyOnWriteStateMap[int, Any, int] = CopyOnWriteStateMap()
    for i in range(n):
        m.put(i, VOID_NAMESPACE, i)
    if tracking:
        m.track_changes()
    best = 0.0
    for _ in range(3):
        start = time.process_time()
        for i in range(n):
            m.put(i, VOID_NAMESPACE, i + 1)
        best = max(best, n / (time.process_time() - start))
    return best


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--entries", type=int, default=1_000_000)
    parser.add_argument("--deltas", type=int, default=10)
    parser.add_argument("--quick", action="store_true")
    parser.add_argument("--seed", type=int, default=29)
    args = parser.parse_args()
    n = 100_000 if args.quick else args.entries
    rng = random.Random(args.seed)
    root = tempfile.mkdtemp(prefix="cowstate-bench-heap-incr-")
    subtask = backend(args.deltas)
    coordinator = CheckpointCoordinator(CheckpointStorage(root, "bench"), [subtask])
    try:
        table = subtask.table(VALUE.name)
        for i in range(n):
            table.put(i, VOID_NAMESPACE, i)
        live = set(range(n))
        next_key = n
        full_time, full_bytes, _ = checkpoint(coordinator)
        times, sizes = [], []
        changed = max(4, n // 100)
        for _ in range(args.deltas):
            keys = rng.sample(sorted(live), changed * 3 // 4)
            for key in keys[: changed // 2]:
                table.put(key, VOID_NAMESPACE, -key)
            for key in keys[changed // 2 :]:
                table.remove(key, VOID_NAMESPACE)
                live.discard(key)
            for key in range(next_key, next_key + changed // 4):
                table.put(key, VOID_NAMESPACE, key)
                live.add(key)
            next_key += changed // 4
            elapsed, size, files = checkpoint(coordinator)
            assert files > 1, "expected a delta"
            times.append(elapsed)
            sizes.append(size)
        chained = coordinator.storage.checkpoint_dir(coordinator.latest_checkpoint.checkpoint_id)  # type: ignore[union-attr]
        chain_restore = restore_time(chained, root, "restore-chain", args.deltas)
        coordinator.force_full = True
        refull_time, refull_bytes, files = checkpoint(coordinator)
        assert files == 1
        full_dir = coordinator.storage.checkpoint_dir(coordinator.latest_checkpoint.checkpoint_id)  # type: ignore[union-attr]
        full_restore = restore_time(full_dir, root, "restore-full", args.deltas)
        off = put_rate(max(1000, n // 10), tracking=False)
        on = put_rate(max(1000, n // 10), tracking=True)
    finally:
        coordinator.close()
        subtask.close()
        shutil.rmtree(root, ignore_errors=True)
    delta_time = sum(times) / len(times)
    delta_bytes = sum(sizes) / len(sizes)
    print(f"heap incremental checkpoints, {n:,} int mappings, 1% changed per round")
    print(f"  full checkpoint      {full_bytes:>12,} B  {full_time * 1000:9.1f} ms")
    print(
        f"  delta (mean of {len(times)})   {delta_bytes:>12,.0f} B  {delta_time * 1000:9.1f} ms"
        f"   bytes {delta_bytes / full_bytes:.2%}, time {delta_time / full_time:.2%} of full"
    )
    print(f"  full again (forced)  {refull_bytes:>12,} B  {refull_time * 1000:9.1f} ms")
    print(
        f"  restore: base + {len(times)} deltas {chain_restore * 1000:9.1f} ms, full "
        f"{full_restore * 1000:9.1f} ms ({chain_restore / full_restore:.2f}x)"
    )
    print(f"  put, tracking off {off:,.0f}/s, on {on:,.0f}/s ({on / off:.2f}x)")


if __name__ == "__main__":
    main()
