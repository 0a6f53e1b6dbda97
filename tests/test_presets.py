"""The presets of ``cowstate check`` exercise everything, and can fail.

Every preset runs over every map (the pure one and the C one where it was
built), the ``tables`` preset over every state table; workloads interrupt
iterations with keyed operations and the run compares the fail-fast outcome
with the contract; ``rehash-snapshots`` takes its snapshots inside rehashes
and says how many. Two planted defects prove the checks see what they are
for: an iterator that ignores the modification count
(``bad-iterator-ignores-mod-count``) and a snapshot that drops the moved high
half of a rehash (``bad-snapshot-omits-moved-high-half``). Everything runs in
process, on a few small workloads.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from cowstate_spec import differential as d
from cowstate_spec.cli import main
from cowstate_spec.differential import run_workload
from cowstate_spec.implementations import C_MAP, TABLE_TYPES, by_name
from cowstate_spec.workloads import PRESETS, WorkloadSpec, operations, preset

MAPS = ["cow-map"] + (["c-map"] if C_MAP is not None else [])
FAIL_FAST_BUG = "bad-iterator-ignores-mod-count"
REHASH_BUG = "bad-snapshot-omits-moved-high-half"


def check(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], *arguments: str
) -> tuple[int, dict[str, Any], str]:
    """``cowstate check ... --master in-process``: the status, summary and report."""
    out = tmp_path / "out"
    code = main(
        [
            "check",
            *arguments,
            "--master",
            "in-process",
            "--no-progress",
            "--out",
            str(out),
            "--regressions-dir",
            str(tmp_path / "regressions"),
            "--max-minimized",
            "1",
        ]
    )
    summary = json.loads((out / "summary.json").read_text())
    return code, summary, capsys.readouterr().out


# ------------------------------------------------------------ what runs


@pytest.mark.parametrize("name", sorted(set(PRESETS) - {"tables"}))
def test_every_map_preset_runs_every_map(name: str) -> None:
    assert preset(name).implementations == MAPS


def test_the_tables_preset_runs_every_table() -> None:
    assert preset("tables").implementations == [t.name for t in TABLE_TYPES]


@pytest.mark.parametrize("name", sorted(PRESETS))
def test_every_preset_interrupts_iterations(name: str) -> None:
    spec = preset(name).model_copy(update={"operations_per_workload": 2000})
    kinds = {
        op[2] for i in range(4) for op in operations(spec, i) if op[0] == "interrupt_iteration"
    }
    assert kinds == {"put", "remove", "get"}


# ------------------------------------------------ fail-fast, operation by operation


def interrupted(taken: int, keyed: str, key: Any, state: Any = None) -> tuple[Any, ...]:
    return ("interrupt_iteration", taken, keyed, key, "ns", state)


FILLED = [("put", k, "ns", k) for k in range(3)]  # capacity 4: no rehash yet


@pytest.mark.parametrize(
    "name", [*MAPS, *(t.name for t in TABLE_TYPES if t.capabilities.fail_fast)]
)
@pytest.mark.parametrize(
    "step, outcome",
    [
        (interrupted(1, "put", 9, 9), d.FAILED_FAST),  # a mapping added
        (interrupted(3, "put", 9, 9), d.FAILED_FAST),  # ... after the last one yielded
        (interrupted(1, "remove", 0), d.FAILED_FAST),  # a mapping removed
        (interrupted(1, "put", 2, 20), d.WENT_ON),  # a state replaced
        (interrupted(1, "remove", 7), d.WENT_ON),  # nothing to remove
        (interrupted(0, "get", 1), d.WENT_ON),
    ],
    ids=["put-new", "put-new-at-end", "remove", "replace", "remove-absent", "get"],
)
def test_interrupted_iteration_agrees_with_the_contract(
    name: str, step: tuple[Any, ...], outcome: str
) -> None:
    result = run_workload(by_name(name), [*FILLED, step], check_every=1, initial_capacity=4)
    assert not result.diverged, (result.expected, result.actual)
    assert result.events == {outcome: 1}


@pytest.mark.parametrize("name", MAPS)
def test_a_rehash_step_must_fail_fast_even_without_a_change(name: str) -> None:
    growing = [("put", k, "ns", k) for k in range(5)]  # the fifth put starts a rehash
    result = run_workload(
        by_name(name), [*growing, interrupted(1, "get", 0)], check_every=1, initial_capacity=4
    )
    assert not result.diverged, (result.expected, result.actual)
    assert result.events == {d.FAILED_FAST: 1}


def test_the_planted_iterator_goes_on_where_it_must_fail() -> None:
    result = run_workload(
        by_name(FAIL_FAST_BUG), [*FILLED, interrupted(1, "put", 9, 9)], initial_capacity=4
    )
    assert result.divergence_at == 3
    assert result.expected is not None and "ConcurrentModificationError" in result.expected
    assert result.actual is not None and "went on" in result.actual
    # Only the last step still checks the count: no difference to see there.
    at_end = run_workload(
        by_name(FAIL_FAST_BUG), [*FILLED, interrupted(3, "put", 9, 9)], initial_capacity=4
    )
    assert not at_end.diverged


# --------------------------------------------------- the presets find the defects


def test_a_preset_finds_the_fail_fast_defect(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    code, summary, report = check(
        tmp_path,
        capsys,
        *("--preset", "tiny", "--workloads", "6", "--ops", "300"),
        *("--implementation", "cow-map", "--implementation", FAIL_FAST_BUG),
    )
    assert code == 1
    assert summary["divergent_workloads"]["cow-map"] == 0
    assert summary["divergent_workloads"][FAIL_FAST_BUG] >= 1
    found = summary["divergences"][0]
    assert found["minimized_trace"][-1][0] == "interrupt_iteration"
    assert "ConcurrentModificationError" in found["minimized_expected"]
    assert "fail-fast checks   :" in report


def test_without_interrupted_iterations_the_fail_fast_defect_hides(tmp_path: Path) -> None:
    """The control: the same workloads minus the new operation miss the defect,
    so the catch above is the fail-fast check's."""
    spec = preset("tiny").model_copy(update={"workloads": 6, "operations_per_workload": 300})
    mix = {**spec.mix, "interrupt_iteration": 0.0}
    without = WorkloadSpec.model_validate({**spec.model_dump(), "mix": mix})
    bug = by_name(FAIL_FAST_BUG)
    assert not any(
        run_workload(bug, operations(without, i), initial_capacity=4).diverged for i in range(6)
    )


def test_rehash_snapshots_finds_the_snapshot_defect_and_counts_its_snapshots(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    code, summary, report = check(
        tmp_path,
        capsys,
        *("--preset", "rehash-snapshots", "--workloads", "2", "--ops", "300"),
        *[arg for name in (*MAPS, REHASH_BUG) for arg in ("--implementation", name)],
    )
    assert code == 1
    assert summary["divergent_workloads"] == {**dict.fromkeys(MAPS, 0), REHASH_BUG: 2}
    events = summary["events"]
    assert events[d.SNAPSHOT_IN_REHASH] >= 20
    assert events[d.SNAPSHOT_IN_REHASH_LATE] >= 1
    assert f"snapshots in rehash: {events[d.SNAPSHOT_IN_REHASH]:,}" in report


def test_rehash_snapshots_concentrates_snapshots_in_rehashes() -> None:
    """Nearly every snapshot of the preset meets a rehash (a few the generator's
    size-only forecast misplaces); a preset of random placement, few."""

    def share(name: str) -> float:
        spec = preset(name)
        taken = in_rehash = 0
        for index in range(2):
            ops = operations(spec, index)[:1500]
            result = run_workload(by_name("cow-map"), ops, initial_capacity=spec.initial_capacity)
            assert not result.diverged
            taken += result.operation_counts["snapshot"]
            in_rehash += result.events.get(d.SNAPSHOT_IN_REHASH, 0)
        return in_rehash / taken

    assert share("rehash-snapshots") >= 0.9
    assert share("rehash-under-snapshots") < 0.5
