"""The state machine of cowstate_spec.machine, over every implementation.

A run goes through ``cowstate_spec.coverage.run_counted``: a derandomized run
(the ``ci`` profile) the coverage test already made passes without running
again, and the other way round (tests/test_coverage_events.py).
"""

import pytest
from hypothesis import settings

from cowstate_spec.coverage import run_counted
from cowstate_spec.implementations import IMPLEMENTATIONS, Implementation
from cowstate_spec.machine import machine_for


@pytest.mark.parametrize("implementation", IMPLEMENTATIONS, ids=repr)
def test_implementation_agrees_with_the_model(implementation: Implementation) -> None:
    current = settings()
    examples = max(10, round(current.max_examples * implementation.example_share))
    run_counted(machine_for(implementation), settings(current, max_examples=examples))
