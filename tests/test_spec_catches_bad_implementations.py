"""The specification must catch every deliberately broken map.

Each bug of cowstate_spec.bad_implementations changes one line of the real
map. The state machine, run without shrinking, must fail on each; and the
unchanged source must pass (so the failures come from the bugs).
"""

import pytest
from hypothesis.errors import Flaky
from hypothesis.stateful import run_state_machine_as_test

from cowstate_spec.bad_implementations import BUGS, Bug, bad_implementation
from cowstate_spec.machine import machine_for
from cowstate_spec.profiles import hunt_settings

# Some bugs need 200 examples under an unlucky PYTHONHASHSEED (string keys'
# buckets follow the salted hash): 800 leaves room for every seed.
HUNT = hunt_settings(max_examples=800, stateful_step_count=50)


@pytest.mark.parametrize("bug", BUGS, ids=lambda bug: bug.name)
def test_state_machine_catches(bug: Bug) -> None:
    machine = machine_for(bad_implementation(bug))
    with pytest.raises((AssertionError, Flaky)):
        run_state_machine_as_test(machine, settings=HUNT)
