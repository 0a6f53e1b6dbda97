"""The storage state machine must catch every broken coordinator and storage of
``cowstate_spec.bad_implementations.STORAGE_BUGS``; the unchanged classes pass
(tests/test_storage_machine.py), so the failures come from the bugs."""

from __future__ import annotations

from typing import Any

import pytest
from hypothesis import HealthCheck, Phase, settings
from hypothesis.errors import Flaky
from hypothesis.stateful import run_state_machine_as_test

from cowstate.checkpoint.coordinator import CheckpointCoordinator
from cowstate_spec.bad_implementations import (
    STORAGE_BUGS,
    STORAGE_BUGS_BACKEND,
    Bug,
    broken_class,
)
from cowstate_spec.storage_machine import storage_machine_for

HUNT = settings(max_examples=300, stateful_step_count=40, derandomize=True, database=None,
                deadline=None, phases=[Phase.generate], report_multiple_bugs=False,
                suppress_health_check=[HealthCheck.too_slow])


@pytest.mark.parametrize("bug", STORAGE_BUGS, ids=lambda bug: bug.name)
def test_storage_machine_catches(bug: Bug) -> None:
    broken: Any = broken_class(bug)
    classes = ({"coordinator_class": broken} if issubclass(broken, CheckpointCoordinator)
               else {"storage_class": broken})
    machine = storage_machine_for(STORAGE_BUGS_BACKEND[bug.name], 1, **classes)
    with pytest.raises((AssertionError, Flaky)):
        run_state_machine_as_test(machine, settings=HUNT)
