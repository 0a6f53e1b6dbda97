"""How make test hands the suite to its workers (tests/schedule.py, G1-G5)."""

from __future__ import annotations

import re
from dataclasses import dataclass
from pathlib import Path
from typing import cast

import pytest
from schedule import LAST, SECONDS, SHARES, SPLIT, UNLISTED, group_of, schedule, seconds

TESTS = Path(__file__).resolve().parent


@dataclass
class FakeItem:
    """What schedule() reads of a pytest item."""

    nodeid: str


def test_a_hunt_and_its_identity_control_share_a_group_other_bugs_do_not() -> None:
    every = "test_spec_catches_every_class.py::"
    catch = group_of(
        f"{every}test_the_backend_machine_catches_within_ci[shallow-serializer-fast-path]"
    )
    control = group_of(
        f"{every}test_the_backend_machine_passes_the_identity_rewrite[shallow-serializer-fast-path]"
    )
    other = group_of(f"{every}test_the_backend_machine_catches_within_ci[clipped-rescaling-range]")
    assert catch == control
    assert other != catch


def test_a_file_not_split_is_one_group_and_a_split_one_is_not() -> None:
    assert group_of("test_cluster.py::test_a") == group_of("test_cluster.py::test_b[x]")
    assert group_of("test_cluster.py::test_a") == "test_cluster.py"
    split = "test_storage_machine.py::test_storage_agrees_with_the_model"
    assert group_of(f"{split}[rocksdb-1]") != group_of(f"{split}[rocksdb-2]")


def test_a_tests_weight_is_its_longest_listed_prefix() -> None:
    heap = "test_storage_machine.py::test_storage_agrees_with_the_model[heap-"
    assert seconds(f"{heap}2]") == SECONDS[heap]
    # a longer prefix wins over a shorter one that matches too
    longer, shorter = "test_fuzz.py::test_reduced_file_run", "test_fuzz.py::"
    nodeid = f"{longer}_restores_exactly_or_refuses_cleanly"
    assert seconds(nodeid) == SECONDS[longer] != SECONDS[shorter]
    assert seconds("test_errors.py::test_unlisted") == UNLISTED


@pytest.mark.parametrize("heavy_at", ["first", "middle", "last"])
def test_groups_are_handed_out_heaviest_first_each_in_one_piece(heavy_at: str) -> None:
    light = [FakeItem(f"test_light.py::test_{i}") for i in range(3)]
    heavy = [
        FakeItem("test_storage_machine.py::test_storage_agrees_with_the_model[rocksdb-2]"),
        FakeItem("test_storage_machine.py::test_storage_agrees_with_the_model[rocksdb-1]"),
    ]
    every = "test_spec_catches_every_class.py::test_the_backend_machine_"
    pair = [
        FakeItem(f"{every}catches_within_ci[shallow-serializer-fast-path]"),
        FakeItem(f"{every}passes_the_identity_rewrite[shallow-serializer-fast-path]"),
    ]
    position = {"first": 0, "middle": 2, "last": 3}[heavy_at]
    items = [*light[:position], heavy[1], *light[position:], pair[0], heavy[0], pair[1]]
    scheduled = list(items)
    schedule(cast(list[pytest.Item], scheduled))
    assert [i.nodeid for i in scheduled] == [
        i.nodeid for i in [heavy[0], heavy[1], pair[0], pair[1], *light]
    ]


def _defined(nodeid_prefix: str) -> bool:
    file, _, rest = nodeid_prefix.partition("::")
    path = TESTS / file
    if not path.is_file():
        return False
    name = re.match(r"[A-Za-z_0-9]*", rest)
    assert name is not None
    return not name.group(0) or f"def {name.group(0)}" in path.read_text()


def test_every_split_file_and_weighed_test_names_a_test_that_exists() -> None:
    stale = [file for file in SPLIT if not (TESTS / file).is_file()]
    stale += [prefix for prefix in SECONDS if not _defined(prefix)]
    stale += [name for pair in SHARES.items() for name in pair if not _defined(name)]
    assert stale == [], f"tests/schedule.py names tests that are gone: {stale}"


def test_the_stale_name_check_catches_a_renamed_test_and_a_removed_file() -> None:
    assert _defined("test_storage_machine.py::test_storage_agrees_with_the_model[heap-")
    assert not _defined("test_storage_machine.py::test_storage_agrees_with_the_modell")
    assert not _defined("test_storage_machine_gone.py::test_x")


def test_the_files_sensitive_to_load_go_last_when_nothing_lighter_can_follow() -> None:
    (late_file,) = sorted(LAST)
    late = FakeItem(f"{late_file}::test_ctrl_c_whenever_it_comes_is_one_line[mid-run]")
    light = FakeItem("test_light.py::test_one")
    heavy = FakeItem("test_storage_machine.py::test_storage_agrees_with_the_model[rocksdb-2]")
    scheduled = [late, light, heavy]
    schedule(cast(list[pytest.Item], scheduled), workers=1)
    assert [i.nodeid for i in scheduled] == [heavy.nodeid, light.nodeid, late.nodeid]


@pytest.mark.parametrize("late_at", ["first", "middle", "last"])
def test_the_files_sensitive_to_load_go_late_with_their_weight_of_light_groups_per_other_worker(
    late_at: str,
) -> None:
    # G4 with 3 workers: the late group (the Ctrl-C test, 10 s) goes before
    # the lightest groups that together weigh at least 2 x 10 s, and after
    # every heavier one; the storage machine's heavy group stays first.
    (late_file,) = sorted(LAST)
    late = FakeItem(f"{late_file}::test_ctrl_c_whenever_it_comes_is_one_line[mid-run]")
    assert seconds(_relative_id(late)) == 10.0
    heavy = FakeItem("test_storage_machine.py::test_storage_agrees_with_the_model[rocksdb-2]")
    light = [FakeItem(f"test_light_{i}.py::test_one") for i in range(120)]  # 0.2 s each
    position = {"first": 0, "middle": 60, "last": 120}[late_at]
    scheduled = [heavy, *light[:position], late, *light[position:]]
    schedule(cast(list[pytest.Item], scheduled), workers=3)
    order = [i.nodeid for i in scheduled]
    assert order[0] == heavy.nodeid
    # 20 s of 0.2 s groups after it: the last 100 light files, in their order
    assert order.index(late.nodeid) == len(order) - 101
    assert order[-100:] == [i.nodeid for i in light[20:]]


def _relative_id(item: FakeItem) -> str:
    return item.nodeid.removeprefix("tests/")


def test_every_late_file_exists() -> None:
    assert [file for file in LAST if not (TESTS / file).is_file()] == []


def test_a_test_that_reuses_a_run_shares_the_group_of_the_test_that_makes_it() -> None:
    for reuser, maker in SHARES.items():
        assert group_of(reuser) == group_of(maker) != group_of(f"{maker}x"), (reuser, maker)
    cov = "test_coverage_events.py::test_machine_reaches_the_rare_paths"
    machine = "test_state_machine.py::test_implementation_agrees_with_the_model"
    assert group_of(f"{cov}[c-map]") == group_of(f"{machine}[c-map]")
    assert group_of(f"{cov}[c-map]") != group_of(f"{machine}[cow-map]")
