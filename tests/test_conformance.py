"""The plug-in API (cowstate_spec.conformance, the pytest plug-in, ``cowstate check
--implementation package.module:factory``) on someone else's map: a map that
agrees passes; a planted bug fails with a replayable step list; capabilities
turn checks off, and every route names what was skipped.

The machines run few, short, derandomized examples (generation only where a
failure is expected): the catches are the ones the state machine makes in
its first examples; the full machines are tests/test_state_machine.py's.
"""

from __future__ import annotations

import functools
import json
import shutil
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
from dict_map import CAPABILITIES, DictMap, NoSnapshotMap, ShallowSnapshotMap, SilentPutMap
from hypothesis import HealthCheck, Phase, settings
from hypothesis.stateful import run_state_machine_as_test

from cowstate.key_groups import KeyGroupRange
from cowstate.state_map import CopyOnWriteStateMap
from cowstate.state_table import CopyOnWriteStateTable
from cowstate_spec.backends import heap_backend
from cowstate_spec.cli import main
from cowstate_spec.conformance import (
    CHECKS,
    Capabilities,
    ConformanceFailure,
    backend_machine_for,
    check_differential,
    implementation,
    machine_for,
    skipped_checks,
)
from cowstate_spec.differential import run_workload
from cowstate_spec.invariants import check_map, fingerprint
from cowstate_spec.workloads import decode

TESTS = Path(__file__).resolve().parent
#: A short derandomized run; ``catch`` only generates (a failure is expected).
QUICK = settings(
    max_examples=12,
    stateful_step_count=25,
    derandomize=True,
    database=None,
    deadline=None,
    suppress_health_check=[HealthCheck.too_slow],
)
CATCH = settings(QUICK, max_examples=100, phases=[Phase.explicit, Phase.generate])


def run(machine: Any, how: settings = QUICK) -> None:
    run_state_machine_as_test(machine, settings=how)


def failure_of(machine: Any) -> Exception:
    with pytest.raises(Exception) as caught:  # an AssertionError, or what the map raised
        run(machine, CATCH)
    return caught.value


def steps(error: BaseException) -> str:
    return "\n".join(getattr(error, "__notes__", []))


# ---------------------------------------------------------------- the machines


def test_a_map_of_someone_else_agrees_with_the_model_through_the_plug_in() -> None:
    machine = machine_for(DictMap, CAPABILITIES)
    run(machine)
    results = check_differential(DictMap, CAPABILITIES, workloads=3)
    assert [r.diverged for r in results] == [False] * 3
    assert sum(r.applied for r in results) == 3 * 500
    # a dict has no internals the spec could judge and no visible rehash
    assert machine.skipped_checks == [CHECKS["structure"], CHECKS["rehash"]]


def test_its_own_refusals_must_be_named_in_its_capabilities() -> None:
    """The control of the test above: with cowstate's refusals a ValueError
    for a None state is a crash, not a refusal."""
    error = failure_of(machine_for(DictMap, Capabilities()))
    assert "expected a refusal (CowStateError)" in str(error)


def test_a_planted_bug_fails_with_a_replayable_step_list() -> None:
    error = failure_of(machine_for(ShallowSnapshotMap, CAPABILITIES))
    assert "changed" in str(error) or "differs" in str(error)
    replay = steps(error)
    assert "state = StateMapMachine[" in replay and "state.snapshot()" in replay
    with pytest.raises(ConformanceFailure) as caught:
        check_differential(ShallowSnapshotMap, CAPABILITIES)
    operations = [decode(op) for op in caught.value.operations]
    assert 2 <= len(operations) <= 10
    bad = implementation(ShallowSnapshotMap, CAPABILITIES)
    assert run_workload(bad, operations, check_every=1, initial_capacity=4).diverged
    good = implementation(DictMap, CAPABILITIES)
    assert not run_workload(good, operations, check_every=1, initial_capacity=4).diverged
    assert "OPERATIONS = [" in str(caught.value)


def test_capabilities_switch_checks_off_and_the_skipped_checks_are_named() -> None:
    without = Capabilities(
        snapshots=False, refusals=(ValueError, TypeError), concurrent_modification=RuntimeError
    )
    machine = machine_for(NoSnapshotMap, without)
    run(machine)
    check_differential(NoSnapshotMap, without, workloads=2)
    assert machine.skipped_checks[0] == CHECKS["snapshots"]
    # the control: with snapshots promised, the machine calls the missing method
    error = failure_of(machine_for(NoSnapshotMap, CAPABILITIES))
    assert "'NoneType' object is not callable" in str(error)

    silent = Capabilities(
        put_reports_insert=False,
        refusals=(ValueError, TypeError),
        concurrent_modification=RuntimeError,
    )
    run(machine_for(SilentPutMap, silent))
    assert CHECKS["put_reports_insert"] in skipped_checks(implementation(SilentPutMap, silent))
    error = failure_of(machine_for(SilentPutMap, CAPABILITIES))
    assert "put" in str(error) and "None" in str(error)


def test_cowstates_own_map_through_the_plug_in_skips_nothing() -> None:
    target = implementation(CopyOnWriteStateMap, check=check_map, fingerprint=fingerprint)
    assert skipped_checks(target) == []
    run(machine_for(target))


def test_table_and_backend_factories_get_their_machines() -> None:
    table = machine_for(CopyOnWriteStateTable, check=None, table=True)
    assert table.skipped_checks == [CHECKS["structure"]]
    run(table, settings(QUICK, max_examples=6))
    backend = backend_machine_for(
        functools.partial(heap_backend, CopyOnWriteStateTable), KeyGroupRange(0, 7)
    )
    assert backend.skipped_checks == []
    run(backend, settings(QUICK, max_examples=4, stateful_step_count=20))


# ------------------------------------------------------------ the pytest plug-in


def test_the_fixture_checks_a_map_and_fails_a_planted_bug_with_its_steps(
    cowstate_conformance: Any,
) -> None:
    skipped = cowstate_conformance.check(DictMap, max_examples=8, workloads=2)
    assert skipped == [CHECKS["structure"], CHECKS["rehash"]]
    with pytest.raises(AssertionError) as caught:
        cowstate_conformance.check(ShallowSnapshotMap, max_examples=30, shrink=False)
    assert "state.snapshot()" in steps(caught.value)


def test_a_three_line_test_file_runs_under_the_pytest_plug_in(tmp_path: Path) -> None:
    """Through the ``pytest11`` entry point, without a conftest; the terminal
    summary names what was skipped."""
    shutil.copy(TESTS / "dict_map.py", tmp_path)
    (tmp_path / "test_my_map.py").write_text(
        "from dict_map import DictMap\n"
        "def test_dict_map(cowstate_conformance):\n"
        "    cowstate_conformance.check(DictMap, max_examples=5, workloads=1)\n"
    )
    outcome = subprocess.run(
        [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "-p", "no:xdist"],
        cwd=tmp_path,
        capture_output=True,
        text=True,
        env={"PATH": "/usr/bin:/bin", "HYPOTHESIS_STORAGE_DIRECTORY": str(tmp_path / ".h")},
    )
    out = outcome.stdout
    assert outcome.returncode == 0, out + outcome.stderr
    assert "1 passed" in out
    assert "cowstate conformance" in out
    assert f"dict_map:DictMap: skipped, for what it lacks: {CHECKS['structure']}" in out


# ------------------------------------------------------------ cowstate check


def test_cowstate_check_imports_a_factory_and_reports_what_it_skipped(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.chdir(TESTS)  # the module is found from the current directory
    out = tmp_path / "out"
    arguments = ["--preset", "tiny", "--workloads", "3", "--master", "in-process"]
    good = ["--implementation", "dict_map:DictMap", "--out", str(out), "--no-progress"]
    code = main(["check", *arguments, *good])
    assert code == 0
    summary = json.loads((out / "summary.json").read_text())
    assert summary["divergent_workloads"] == {"dict_map:DictMap": 0}
    assert summary["skipped_checks"] == {
        "dict_map:DictMap": [CHECKS["structure"], CHECKS["rehash"]]
    }
    assert "skipped checks     : dict_map:DictMap lacks what they need" in capsys.readouterr().out

    bad = ["--implementation", "dict_map:ShallowSnapshotMap", "--out", str(tmp_path / "bad")]
    assert main(["check", *arguments, *bad, "--no-progress"]) == 1
    assert "dict_map:ShallowSnapshotMap workload 0" in capsys.readouterr().out

    missing = ["--implementation", "dict_map:NoSuchMap", "--out", str(tmp_path / "x")]
    assert main(["check", *arguments, *missing]) == 2
    error = capsys.readouterr().err
    assert error.count("\n") == 1
    assert "module 'dict_map' has no 'NoSuchMap'" in error
