"""Every defect class backed twice: each is caught by a state machine exploring
on its own, within the ``ci`` profile's budget.

The classes and their planted bugs are ``DEFECT_CLASSES`` of
``cowstate_spec.bad_implementations`` (the table in its module doc). Each hunt
here is generation only (no shrinking, no database, derandomized, the first
failure ends it) with the budget the machine's own test gets under ``ci``:
the map and table machines ``max_examples`` x ``stateful_step_count``
(tests/test_state_machine.py), the backend machine twice the steps
(tests/test_backend_machine.py), the storage machine a quarter of the examples
(tests/test_storage_machine.py). Three classes are also hunted with the
``mutation`` profile's settings (fixed seeds, no shrinking, 60 x 40). The
backend machine runs writer threads, so a failure that does not replay the
same way is reported as ``Flaky``: caught. Each layer bug has an identity
control (its ``old`` text replaced by itself, the same callers rebound) that
must pass, so a catch comes from the bug and not from the rebuilt classes.
"""

from __future__ import annotations

from typing import Any

import pytest
from hypothesis import settings
from hypothesis.errors import Flaky
from hypothesis.stateful import run_state_machine_as_test
from test_spec_catches_bad_storage import machine_with

from cowstate.errors import CheckpointError
from cowstate.key_groups import KeyGroupRange
from cowstate.maps import c_map_class
from cowstate_spec.backend_machine import MAX_PARALLELISM
from cowstate_spec.bad_cmaps import C_BUGS, C_REWRITES, bad_cmap_implementation, c_identity
from cowstate_spec.bad_implementations import (
    BUGS,
    DEFECT_CLASSES,
    MUTATION_CLASSES,
    STORAGE_BUGS,
    STORAGE_BUGS_BACKEND,
    Bug,
    bad_implementation,
)
from cowstate_spec.bad_layers import (
    BACKEND_LAYER_BUGS,
    TABLE_LAYER_BUGS,
    LayerBug,
    bad_layer_backend_machine,
    bad_layer_storage_kind,
    bad_layer_table,
    identity,
    storage_layer_bugs,
)
from cowstate_spec.machine import machine_for
from cowstate_spec.profiles import hunt_settings
from cowstate_spec.storage_machine import StorageMachine, storage_machine_for

CI = settings.get_profile("ci")
MAP_HUNT = hunt_settings(CI.max_examples, CI.stateful_step_count)
BACKEND_HUNT = hunt_settings(CI.max_examples, 2 * CI.stateful_step_count)
STORAGE_HUNT = hunt_settings(max(10, CI.max_examples // 4), CI.stateful_step_count)
_MUTATION = settings.get_profile("mutation")
MUTATION_HUNT = hunt_settings(_MUTATION.max_examples, _MUTATION.stateful_step_count)

FULL_RANGE = KeyGroupRange(0, MAX_PARALLELISM - 1)


def of_machine(machine: str) -> list[str]:
    """The planted bugs ``DEFECT_CLASSES`` assigns to ``machine``, in table order."""
    return [name for pairs in DEFECT_CLASSES.values() for m, name in pairs if m == machine]


def named(bugs: list[Any], names: list[str]) -> list[Any]:
    by_name = {bug.name: bug for bug in bugs}
    return [by_name[name] for name in names]


# --------------------------------------------------------- the table itself


def test_every_defect_class_has_a_planted_bug_in_its_machine_list() -> None:
    c_bugs: list[Any] = [*C_BUGS, *C_REWRITES]
    lists: dict[str, list[str]] = {
        "map": [b.name for b in BUGS],
        "c-map": [b.name for b in c_bugs],
        "table": [b.name for b in TABLE_LAYER_BUGS],
        "backend": [b.name for b in BACKEND_LAYER_BUGS],
        "storage": [b.name for b in [*STORAGE_BUGS, *storage_layer_bugs()]],
    }
    # The 9 map classes and 9 of the layers above, get's version check,
    # and issue 26's leaked reference.
    assert len(DEFECT_CLASSES) == 22, sorted(DEFECT_CLASSES)
    for defect, pairs in DEFECT_CLASSES.items():
        assert pairs, f"{defect!r} has no planted bug"
        for machine, name in pairs:
            assert name in lists[machine], f"{defect!r}: {name!r} is not in the {machine} list"
    assert set(MUTATION_CLASSES) <= set(DEFECT_CLASSES)


# --------------------------------------------------------------------- maps


@pytest.mark.parametrize("bug", named(BUGS, of_machine("map")), ids=lambda bug: bug.name)
def test_the_map_machine_catches_within_ci(bug: Bug) -> None:
    with pytest.raises(AssertionError):
        run_state_machine_as_test(machine_for(bad_implementation(bug)), settings=MAP_HUNT)


MUTATION_BUGS = [
    name for defect in MUTATION_CLASSES for m, name in DEFECT_CLASSES[defect] if m == "map"
]


@pytest.mark.parametrize("bug", named(BUGS, MUTATION_BUGS), ids=lambda bug: bug.name)
def test_the_map_machine_catches_under_the_mutation_profile(bug: Bug) -> None:
    with pytest.raises(AssertionError):
        run_state_machine_as_test(machine_for(bad_implementation(bug)), settings=MUTATION_HUNT)


NO_C_MAP = pytest.mark.skipif(
    c_map_class() is None,
    reason="the C map is not built (tests/test_implementations.py fails for that)",
)


@NO_C_MAP
@pytest.mark.parametrize(
    "bug", named([*C_BUGS, *C_REWRITES], of_machine("c-map")), ids=lambda bug: bug.name
)
def test_the_c_map_machine_catches_within_ci(bug: Any) -> None:
    with pytest.raises(AssertionError):
        run_state_machine_as_test(machine_for(bad_cmap_implementation(bug)), settings=MAP_HUNT)


@NO_C_MAP
@pytest.mark.parametrize("bug", C_REWRITES, ids=lambda bug: bug.name)
def test_the_c_map_machine_passes_the_identity_rewrite(bug: Any) -> None:
    """The rewritten copy compiles and loads like the real map: with its text
    replaced by itself it passes the same hunt."""
    run_state_machine_as_test(
        machine_for(bad_cmap_implementation(c_identity(bug))), settings=MAP_HUNT
    )


# ------------------------------------------------------------------- tables


@pytest.mark.parametrize("bug", TABLE_LAYER_BUGS, ids=lambda bug: bug.name)
def test_the_table_machine_catches_within_ci(bug: LayerBug) -> None:
    with pytest.raises(AssertionError):
        run_state_machine_as_test(machine_for(bad_layer_table(bug)), settings=MAP_HUNT)


@pytest.mark.parametrize("bug", TABLE_LAYER_BUGS, ids=lambda bug: bug.name)
def test_the_table_machine_passes_the_identity_rewrite(bug: LayerBug) -> None:
    run_state_machine_as_test(machine_for(bad_layer_table(identity(bug))), settings=MAP_HUNT)


# ----------------------------------------------------------------- backends


@pytest.mark.parametrize("bug", BACKEND_LAYER_BUGS, ids=lambda bug: bug.name)
def test_the_backend_machine_catches_within_ci(bug: LayerBug, forced_interleavings: None) -> None:
    with pytest.raises((AssertionError, Flaky)):
        run_state_machine_as_test(bad_layer_backend_machine(bug, FULL_RANGE), settings=BACKEND_HUNT)


@pytest.mark.parametrize("bug", BACKEND_LAYER_BUGS, ids=lambda bug: bug.name)
def test_the_backend_machine_passes_the_identity_rewrite(
    bug: LayerBug, forced_interleavings: None
) -> None:
    machine = bad_layer_backend_machine(identity(bug), FULL_RANGE)
    run_state_machine_as_test(machine, settings=settings(BACKEND_HUNT, max_examples=40))


# ------------------------------------------------------------------ storage


def storage_machine_with(bug: LayerBug) -> type[StorageMachine]:
    """The storage machine over the class ``bug`` breaks (as
    tests/test_spec_catches_bad_storage.py builds it), or over a broken
    RocksDB backend for a bug of ``storage_layer_bugs()``."""
    if bug.name in STORAGE_BUGS_BACKEND:
        assert isinstance(bug, Bug)
        return machine_with(bug)
    machine = storage_machine_for("rocksdb", 1)
    return type(machine.__name__, (machine,), {"kind": bad_layer_storage_kind(bug)})


STORAGE_CLASS_BUGS = named([*STORAGE_BUGS, *storage_layer_bugs()], of_machine("storage"))


@pytest.mark.parametrize("bug", STORAGE_CLASS_BUGS, ids=lambda bug: bug.name)
def test_the_storage_machine_catches_within_ci(bug: LayerBug) -> None:
    # A native savepoint listing shared files is refused by the coordinator's
    # own write-time check (InconsistentMetadataError inside CheckpointError):
    # the machine's savepoint rule fails with it.
    with pytest.raises((AssertionError, Flaky, CheckpointError)) as caught:
        run_state_machine_as_test(storage_machine_with(bug), settings=STORAGE_HUNT)
    if isinstance(caught.value, CheckpointError):
        assert "shared file" in str(caught.value), caught.value


@pytest.mark.parametrize("bug", storage_layer_bugs(), ids=lambda bug: bug.name)
def test_the_storage_machine_passes_the_identity_rewrite(bug: LayerBug) -> None:
    run_state_machine_as_test(
        storage_machine_with(identity(bug)), settings=settings(STORAGE_HUNT, max_examples=4)
    )
