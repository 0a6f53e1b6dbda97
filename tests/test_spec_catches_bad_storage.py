"""The storage state machine must catch every broken coordinator, registry and
storage of ``cowstate_spec.bad_implementations.STORAGE_BUGS``.

Most are found by the machine's own random exploration (``HUNT``). Some need
a long, specific history -- a RocksDB job restored from its latest checkpoint
at the same parallelism in NO_CLAIM or LEGACY mode, then several checkpoints;
three pending checkpoints completed out of step -- which the exploration
meets too rarely for CI; for those, ``REPLAYS``
drives the same machine (same rules, same invariants) through that history
step by step, and the unchanged classes must pass every replay, so the
failures come from the bugs.
"""

from __future__ import annotations

import functools
from typing import Any

import pytest
from hypothesis.errors import Flaky
from hypothesis.stateful import run_state_machine_as_test

from cowstate.checkpoint.coordinator import CheckpointCoordinator
from cowstate.checkpoint.recovery import Recovery
from cowstate.checkpoint.registry import SharedStateRegistry
from cowstate.heap_backend import HeapKeyedStateBackend
from cowstate_spec.backends import BackendImplementation, heap_incremental_backend
from cowstate_spec.bad_implementations import (
    STORAGE_BUGS,
    STORAGE_BUGS_BACKEND,
    STORAGE_BUGS_RETAINED,
    Bug,
    broken_class,
)
from cowstate_spec.profiles import hunt_settings
from cowstate_spec.storage_machine import StorageMachine, storage_machine_for

HUNT = hunt_settings(max_examples=300, stateful_step_count=40)

Step = tuple[str, dict[str, Any]]


def load(keys: range, value: int) -> list[Step]:
    return [("change_state", {"operation": "update", "key": k, "value": value}) for k in keys]


def restart(mode: str, checkpoints: int) -> list[Step]:
    """Checkpoint, restart from that checkpoint in ``mode``, then ``checkpoints``
    rounds of changing some keys and checkpointing."""
    steps = [
        *load(range(16), 1),
        ("trigger_checkpoint", {"complete_now": True}),
        (
            "restore",
            {
                "source": "the latest checkpoint",
                "index": 0,
                "mode": mode,
                "parallelism": "the same",
            },
        ),
    ]
    for round_ in range(checkpoints):
        steps += [
            *load(range(round_ * 4, round_ * 4 + 4), round_ + 2),
            ("trigger_checkpoint", {"complete_now": True}),
        ]
    return steps


REPLAYS: dict[str, list[Step]] = {
    "no-claim-does-not-force-full": restart("no-claim", 1),
    "registry-deletes-disowned-files": restart("legacy", 6),
    # The storage machine's lost SST (CHANGELOG): 3 is triggered on 1's SSTs,
    # and completing 2 subsumes 1 while 3 is pending.
    "subsume-deletes-what-a-pending-checkpoint-reuses": [
        *load(range(16), 1),
        ("trigger_checkpoint", {"complete_now": False}),
        ("trigger_checkpoint", {"complete_now": False}),
        ("complete_checkpoint", {"index": 0}),
        ("trigger_checkpoint", {"complete_now": False}),
        *load(range(4), 2),
        ("complete_checkpoint", {"index": 0}),
        ("complete_checkpoint", {"index": 0}),
    ],
    # The storage machine's leaked claimed SST (CHANGELOG): a CLAIMed checkpoint
    # subsumed by the first checkpoint that reuses its SSTs, a crash, then a
    # checkpoint that no longer uses them.
    "recovery-forgets-a-settled-claim": [
        *load(range(16), 1),
        ("trigger_checkpoint", {"complete_now": True}),
        ("restart_from_the_latest_checkpoint", {"mode": "claim"}),
        ("trigger_checkpoint", {"complete_now": True}),
        ("inject_fault", {"countdown": 1, "kind": "crash now"}),
        *load(range(16), 2),
        ("trigger_checkpoint", {"complete_now": True}),
        *load(range(16), 3),
        ("trigger_checkpoint", {"complete_now": True}),  # compacted: the claimed SSTs go
    ],
    # A chain of max_deltas (3) deltas, then a full checkpoint, two retained: the
    # full one subsumes chk-3, and the base is left with one user, chk-4, whose
    # chain still names it.
    "registry-deletes-a-chain-file-still-used": [
        step
        for round_ in range(1, 6)
        for step in (
            *load(range(round_, round_ + 2), round_),
            ("trigger_checkpoint", {"complete_now": True}),
        )
    ],
    "delta-misses-a-removal": [
        *load(range(8), 1),
        ("trigger_checkpoint", {"complete_now": True}),  # the base
        ("change_state", {"operation": "clear", "key": 3, "value": 0}),
        ("trigger_checkpoint", {"complete_now": True}),  # a delta: must remove key 3
    ],
    "restore-applies-removals-to-the-wrong-key-group": [
        *load(range(8), 1),
        ("trigger_checkpoint", {"complete_now": True}),  # the base
        ("change_state", {"operation": "clear", "key": 3, "value": 0}),
        ("change_state", {"operation": "clear", "key": 6, "value": 0}),
        ("trigger_checkpoint", {"complete_now": True}),  # a delta removing keys 3 and 6
        (
            "restore",
            {"source": "the latest checkpoint", "index": 0, "mode": "no-claim", "parallelism": 3},
        ),
    ],
    "delta-against-the-wrong-base": [
        *load(range(8), 1),
        ("trigger_checkpoint", {"complete_now": True}),  # the base
        *load(range(2), 5),
        ("trigger_checkpoint", {"complete_now": False}),  # written, never confirmed
        *load(range(2, 4), 6),
        ("trigger_checkpoint", {"complete_now": True}),  # must hold keys 0-3's changes
    ],
    "garbage-deletes-what-the-job-does-not-own": [
        *load(range(8), 1),
        ("trigger_checkpoint", {"complete_now": True}),
        ("savepoint", {"savepoint_format": "canonical", "where": "inside the job directory"}),
        ("inject_fault", {"countdown": 1, "kind": "crash now"}),
    ],
}


def machine_with(bug: Bug) -> type[StorageMachine]:
    broken: Any = broken_class(bug)
    if issubclass(broken, HeapKeyedStateBackend):  # a heap incremental backend's bug
        machine = storage_machine_for(
            STORAGE_BUGS_BACKEND[bug.name], STORAGE_BUGS_RETAINED[bug.name]
        )
        kind = BackendImplementation(
            f"heap-incremental[{bug.name}]",
            functools.partial(heap_incremental_backend, backend_class=broken),
        )
        return type(machine.__name__, (machine,), {"kind": kind})
    if issubclass(broken, SharedStateRegistry):
        broken = type(
            "CoordinatorWithBrokenRegistry", (CheckpointCoordinator,), {"registry_class": broken}
        )
    elif issubclass(broken, Recovery):
        broken = type(
            "CoordinatorWithBrokenRecovery", (CheckpointCoordinator,), {"recovery_class": broken}
        )
    classes = (
        {"coordinator_class": broken}
        if issubclass(broken, CheckpointCoordinator)
        else {"storage_class": broken}
    )
    return storage_machine_for(
        STORAGE_BUGS_BACKEND[bug.name], STORAGE_BUGS_RETAINED[bug.name], **classes
    )


def replay(machine_class: type[StorageMachine], steps: list[Step]) -> None:
    """Run ``steps`` on a fresh machine, checking every invariant after each."""
    machine = machine_class()
    try:
        for rule, arguments in steps:
            getattr(machine, rule)(**arguments)
            machine.live_state_agrees()
            machine.files_on_disk_are_exactly_the_referenced_ones()
            machine.every_snapshot_restores_to_its_moment()
            machine.nothing_outside_the_job_was_asked_to_be_deleted()
    finally:
        machine.teardown()


@pytest.mark.parametrize(
    "bug", [b for b in STORAGE_BUGS if b.name not in REPLAYS], ids=lambda bug: bug.name
)
def test_storage_machine_catches(bug: Bug) -> None:
    with pytest.raises((AssertionError, Flaky)):
        run_state_machine_as_test(machine_with(bug), settings=HUNT)


@pytest.mark.parametrize(
    "bug", [b for b in STORAGE_BUGS if b.name in REPLAYS], ids=lambda bug: bug.name
)
def test_storage_machine_catches_in_replay(bug: Bug) -> None:
    with pytest.raises(AssertionError):
        replay(machine_with(bug), REPLAYS[bug.name])


@pytest.mark.parametrize("name", sorted(REPLAYS))
def test_replays_pass_with_the_real_classes(name: str) -> None:
    replay(
        storage_machine_for(STORAGE_BUGS_BACKEND[name], STORAGE_BUGS_RETAINED[name]), REPLAYS[name]
    )
