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

Under ``COWSTATE_STRENGTH=reduced`` (``make test``) each control runs as many
examples as its bug's hunt took (``cowstate_spec.profiles.hunt`` counts them;
the derandomized control meets the same first examples), at most its full
budget; ``make strength`` runs the full budgets.
"""

from __future__ import annotations

import re
import subprocess
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
from hypothesis import settings
from hypothesis.errors import Flaky
from hypothesis.stateful import RuleBasedStateMachine, rule, run_state_machine_as_test
from test_spec_catches_bad_storage import machine_with

from cowstate.errors import CheckpointError
from cowstate.key_groups import KeyGroupRange
from cowstate.maps import c_map_class
from cowstate_spec.backend_machine import MAX_PARALLELISM
from cowstate_spec.bad_cmaps import (
    C_BUGS,
    C_REWRITES,
    C_TRACKING_REWRITES,
    bad_cmap_implementation,
    c_identity,
)
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
from cowstate_spec.profiles import control_examples, hunt, hunt_settings, strength
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
    c_bugs: list[Any] = [*C_BUGS, *C_REWRITES, *C_TRACKING_REWRITES]
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


# ------------------------------------------------------- the suite's two tiers


def test_make_test_runs_the_strength_suites_reduced_and_make_strength_runs_them_full() -> None:
    """CI runs make test (.ci/run), so the strength suites run there, reduced;
    make strength runs them full. (They were left out of make test before.)"""
    root = Path(__file__).resolve().parents[1]
    assert (root / ".ci" / "run").read_text().strip().endswith("\nmake test")

    def recipe(target: str) -> str:
        dry = subprocess.run(
            ["make", "-n", "--always-make", target], cwd=root, capture_output=True, text=True
        )
        assert dry.returncode == 0, dry.stderr
        return " ".join(line for line in dry.stdout.splitlines() if " -m pytest " in line)

    strength_files = re.search(
        r"^STRENGTH_TESTS = (.+?)(?<!\\)$", (root / "Makefile").read_text(), re.M | re.S
    )
    assert strength_files is not None
    files = strength_files.group(1).replace("\\\n", " ").split()
    assert files == [
        "tests/test_spec_catches_every_class.py",
        "tests/test_user_code_errors.py",
        "tests/test_symbolic.py",
        "tests/test_spec_catches_bad_cmaps.py",
        "tests/test_spec_catches_bad_backends.py",
        "tests/test_spec_catches_bad_implementations.py",
    ]
    make_test = recipe("test")
    assert "-m pytest" in make_test and "--ignore" not in make_test
    assert "COWSTATE_STRENGTH" not in make_test  # the default: reduced
    make_strength = recipe("strength")
    assert make_strength.startswith("COWSTATE_STRENGTH=full ")
    assert all(name in make_strength for name in files)


class FailsAtTheThirdExample(RuleBasedStateMachine):
    examples = 0

    def __init__(self) -> None:
        super().__init__()
        FailsAtTheThirdExample.examples += 1

    @rule()
    def step(self) -> None:
        assert FailsAtTheThirdExample.examples < 3


def test_a_hunt_counts_the_examples_until_the_catch_and_fails_without_one() -> None:
    FailsAtTheThirdExample.examples = 0
    # three examples, the third replayed once to report it
    assert hunt(FailsAtTheThirdExample, MAP_HUNT, (AssertionError,)) == 4
    with pytest.raises(AssertionError, match=r"within 5 examples x 40 steps, it passed 5$"):
        hunt(Passes, settings(MAP_HUNT, max_examples=5), (AssertionError,))


class Passes(RuleBasedStateMachine):
    @rule()
    def step(self) -> None:
        pass


def test_a_control_runs_as_far_as_its_hunt_in_the_reduced_form_and_fully_in_the_full(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setenv("COWSTATE_STRENGTH", "reduced")
    assert (control_examples(7, 40), control_examples(70, 40)) == (7, 40)
    monkeypatch.setenv("COWSTATE_STRENGTH", "full")
    assert (control_examples(7, 40), control_examples(70, 40)) == (40, 40)
    monkeypatch.setenv("COWSTATE_STRENGTH", "most")
    with pytest.raises(ValueError, match="expected COWSTATE_STRENGTH in"):
        strength()


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
    "bug",
    named([*C_BUGS, *C_REWRITES, *C_TRACKING_REWRITES], of_machine("c-map")),
    ids=lambda bug: bug.name,
)
def test_the_c_map_machine_catches_within_ci(bug: Any) -> None:
    caught_after("c-map", bug)


@NO_C_MAP
@pytest.mark.parametrize("bug", [*C_REWRITES, *C_TRACKING_REWRITES], ids=lambda bug: bug.name)
def test_the_c_map_machine_passes_the_identity_rewrite(bug: Any) -> None:
    """The rewritten copy compiles and loads like the real map: with its text
    replaced by itself it passes the same hunt."""
    examples = control_examples(caught_after("c-map", bug), MAP_HUNT.max_examples)
    run_state_machine_as_test(
        machine_for(bad_cmap_implementation(c_identity(bug))),
        settings=settings(MAP_HUNT, max_examples=examples),
    )


# ------------------------------------------------------------------- tables


@pytest.mark.parametrize("bug", TABLE_LAYER_BUGS, ids=lambda bug: bug.name)
def test_the_table_machine_catches_within_ci(bug: LayerBug) -> None:
    caught_after("table", bug)


@pytest.mark.parametrize("bug", TABLE_LAYER_BUGS, ids=lambda bug: bug.name)
def test_the_table_machine_passes_the_identity_rewrite(bug: LayerBug) -> None:
    examples = control_examples(caught_after("table", bug), MAP_HUNT.max_examples)
    run_state_machine_as_test(
        machine_for(bad_layer_table(identity(bug))),
        settings=settings(MAP_HUNT, max_examples=examples),
    )


# ----------------------------------------------------------------- backends


@pytest.mark.parametrize("bug", BACKEND_LAYER_BUGS, ids=lambda bug: bug.name)
def test_the_backend_machine_catches_within_ci(bug: LayerBug, forced_interleavings: None) -> None:
    caught_after("backend", bug)


@pytest.mark.parametrize("bug", BACKEND_LAYER_BUGS, ids=lambda bug: bug.name)
def test_the_backend_machine_passes_the_identity_rewrite(
    bug: LayerBug, forced_interleavings: None
) -> None:
    machine = bad_layer_backend_machine(identity(bug), FULL_RANGE)
    examples = control_examples(caught_after("backend", bug), 40)
    run_state_machine_as_test(machine, settings=settings(BACKEND_HUNT, max_examples=examples))


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
    caught_after("storage", bug)


@pytest.mark.parametrize("bug", storage_layer_bugs(), ids=lambda bug: bug.name)
def test_the_storage_machine_passes_the_identity_rewrite(bug: LayerBug) -> None:
    examples = control_examples(caught_after("storage", bug), 4)
    run_state_machine_as_test(
        storage_machine_with(identity(bug)), settings=settings(STORAGE_HUNT, max_examples=examples)
    )


# ------------------------------------------------------------------- hunts


def storage_failure(exc: BaseException) -> None:
    # A native savepoint listing shared files is refused by the coordinator's
    # own write-time check (InconsistentMetadataError inside CheckpointError):
    # the machine's savepoint rule fails with it.
    if isinstance(exc, CheckpointError):
        assert "shared file" in str(exc), exc


#: Per machine: the machine over a planted bug, its hunt, what counts as caught,
#: and a closer look at what was raised.
HUNTS: dict[
    str,
    tuple[
        Callable[[Any], type[RuleBasedStateMachine]],
        settings,
        tuple[type[BaseException], ...],
        Callable[[BaseException], None],
    ],
] = {
    "c-map": (
        lambda bug: machine_for(bad_cmap_implementation(bug)),
        MAP_HUNT,
        (AssertionError,),
        lambda exc: None,
    ),
    "table": (
        lambda bug: machine_for(bad_layer_table(bug)),
        MAP_HUNT,
        (AssertionError,),
        lambda exc: None,
    ),
    "backend": (
        lambda bug: bad_layer_backend_machine(bug, FULL_RANGE),
        BACKEND_HUNT,
        (AssertionError, Flaky),
        lambda exc: None,
    ),
    "storage": (
        storage_machine_with,
        STORAGE_HUNT,
        (AssertionError, Flaky, CheckpointError),
        storage_failure,
    ),
}


def caught_after(machine: str, bug: Any) -> int:
    """Hunt ``bug`` with ``machine``'s hunt (it must be caught); the examples
    it took. Once per bug and process: the catch test and its control share it."""
    key = (machine, bug.name)
    if key not in CAUGHT_AFTER:
        build, hunting, caught, check = HUNTS[machine]
        CAUGHT_AFTER[key] = hunt(build(bug), hunting, caught, check)
    return CAUGHT_AFTER[key]


CAUGHT_AFTER: dict[tuple[str, str], int] = {}
