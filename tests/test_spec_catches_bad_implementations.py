"""The specification must catch every deliberately broken map.

Each bug of cowstate_spec.bad_implementations changes one line of the real
map. The state machine, run without shrinking, must fail on each; and the
unchanged source must pass (so the failures come from the bugs): each rewritten
method, rewritten with its line replaced by itself, runs as a control.
"""

import pytest
from hypothesis import settings
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


#: One control per rewritten method: the same rewrite mechanism, with the line
#: replaced by itself. The machine must pass it, so a catch above comes from
#: the bug and not from a class the rewriting broke.
CONTROLS = list(
    {
        (bug.cls, bug.method, bug.tracked): Bug(
            f"identity-{bug.cls.__name__}-{bug.method}{'-tracked' if bug.tracked else ''}",
            bug.method,
            bug.old,
            bug.old,
            "control",
            bug.cls,
            bug.tracked,
        )
        for bug in BUGS
    }.values()
)


@pytest.mark.parametrize("control", CONTROLS, ids=lambda bug: bug.name)
def test_the_identity_rewrite_passes(control: Bug) -> None:
    machine = machine_for(bad_implementation(control))
    run_state_machine_as_test(machine, settings=settings(HUNT, max_examples=60))
