"""The state machine of cowstate_spec.machine, over every implementation."""

import pytest
from hypothesis import settings
from hypothesis.stateful import run_state_machine_as_test

from cowstate_spec.implementations import IMPLEMENTATIONS, Implementation
from cowstate_spec.machine import machine_for


@pytest.mark.parametrize("implementation", IMPLEMENTATIONS, ids=repr)
def test_implementation_agrees_with_the_model(implementation: Implementation) -> None:
    current = settings()
    examples = max(10, round(current.max_examples * implementation.example_share))
    run_state_machine_as_test(
        machine_for(implementation), settings=settings(current, max_examples=examples)
    )
