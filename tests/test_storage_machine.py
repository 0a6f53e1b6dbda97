"""The storage state machine (cowstate_spec.storage_machine) over every backend
kind, retaining one and two checkpoints."""

from __future__ import annotations

import pytest
from hypothesis import settings
from hypothesis.stateful import run_state_machine_as_test

from cowstate_spec.storage_machine import storage_machine_for


@pytest.mark.parametrize("num_retained", [1, 2])
@pytest.mark.parametrize("kind", ["heap", "rocksdb"])
def test_storage_agrees_with_the_model(kind: str, num_retained: int) -> None:
    # Each step restores snapshots and lists the whole storage root: an eighth
    # of the profile's examples keeps the four runs within the CI budget (make
    # deep: the deep profile's), a sixteenth for RocksDB (a database opened
    # per restore: twice the heap's cost per step; at least 10 runs). The
    # planted storage bugs are hunted with their own budgets
    # (tests/test_spec_catches_bad_storage.py, _every_class.py).
    current = settings()
    share = 16 if kind == "rocksdb" else 8
    run_state_machine_as_test(
        storage_machine_for(kind, num_retained),
        settings=settings(current, max_examples=max(10, current.max_examples // share)),
    )


def test_heap_incremental_storage_agrees_with_the_model() -> None:
    # Heap incremental checkpoints (chains of a base and deltas, cut at three
    # deltas, removal logs of four records): retaining two, so subsumption
    # keeps what a retained chain still uses; an eighth of the profile's
    # examples (about 13 CPU seconds under ci) for the CI budget.
    current = settings()
    run_state_machine_as_test(
        storage_machine_for("heap-incremental", 2),
        settings=settings(current, max_examples=max(10, current.max_examples // 8)),
    )
