"""The backend state machine over every backend of cowstate_spec.backends, with
asynchronous writers forced to interleave with the owner thread."""

from __future__ import annotations

import pytest
from hypothesis import settings

from cowstate.key_groups import KeyGroupRange
from cowstate_spec.backend_machine import MAX_PARALLELISM, backend_machine_for
from cowstate_spec.backends import BACKENDS, HEAP_INCREMENTAL, BackendImplementation
from cowstate_spec.coverage import run_counted

RANGES = [KeyGroupRange(0, MAX_PARALLELISM - 1), KeyGroupRange(2, 6)]


@pytest.mark.parametrize("key_group_range", RANGES, ids=repr)
@pytest.mark.parametrize("implementation", BACKENDS, ids=repr)
def test_backend_agrees_with_the_model(
    implementation: BackendImplementation,
    key_group_range: KeyGroupRange,
    forced_interleavings: None,
) -> None:
    # Twice the profile's steps: a snapshot, mutations while it is written,
    # its completion and a restore from it need room in one run.
    # (Through run_counted: the coverage test reuses the heap-cow-pure run.)
    current = settings()
    run_counted(
        backend_machine_for(implementation, key_group_range),
        settings(current, stateful_step_count=2 * current.stateful_step_count),
    )


def test_heap_incremental_backend_tracks_what_every_kind_changes(
    forced_interleavings: None,
) -> None:
    # The maps track changes (rules T and D of cowstate.state_map) while every
    # kind's handles write through them and writers race the owner: the
    # machine's ChangeTracking rule takes bases and checks the tracked changes
    # and removals against the model after every step. Over the full range
    # only and the profile's steps (not twice them), for the CI budget.
    run_counted(backend_machine_for(HEAP_INCREMENTAL, RANGES[0]), settings())
