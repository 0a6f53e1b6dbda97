"""The specification must catch every deliberately broken map.

Each bug of cowstate_spec.bad_implementations changes one line of the real
map. The state machine, run without shrinking, must fail on each; and the
unchanged source must pass (so the failures come from the bugs): each rewritten
method, rewritten with its line replaced by itself, runs as a control.
"""

import functools

import pytest
from hypothesis import settings
from hypothesis.errors import Flaky
from hypothesis.stateful import run_state_machine_as_test

from cowstate_spec.bad_implementations import BUGS, Bug, bad_implementation
from cowstate_spec.machine import machine_for
from cowstate_spec.profiles import control_examples, hunt, hunt_settings

# Some bugs need 200 examples under an unlucky PYTHONHASHSEED (string keys'
# buckets follow the salted hash): 800 leaves room for every seed.
HUNT = hunt_settings(max_examples=800, stateful_step_count=50)


@functools.cache
def examples_to_catch(bug: Bug) -> int:
    """How many examples of the hunt the state machine starts until it catches
    ``bug`` (``cowstate_spec.profiles.hunt``; it fails if the hunt passes).
    Once per bug and process: the catch test and its control share it."""
    return hunt(machine_for(bad_implementation(bug)), HUNT, (AssertionError, Flaky))


@pytest.mark.parametrize("bug", BUGS, ids=lambda bug: bug.name)
def test_state_machine_catches(bug: Bug) -> None:
    assert 0 < examples_to_catch(bug) <= HUNT.max_examples + 1


#: One control per rewritten method: the same rewrite mechanism, with the line
#: replaced by itself. The machine must pass it, so a catch above comes from
#: the bug and not from a class the rewriting broke. Each with the bugs of
#: its method.
CONTROLS: dict[tuple[type, str, bool], tuple[Bug, list[Bug]]] = {}
for _bug in BUGS:
    _key = (_bug.cls, _bug.method, _bug.tracked)
    if _key not in CONTROLS:
        CONTROLS[_key] = (
            Bug(
                f"identity-{_bug.cls.__name__}-{_bug.method}{'-tracked' if _bug.tracked else ''}",
                _bug.method,
                _bug.old,
                _bug.old,
                "control",
                _bug.cls,
                _bug.tracked,
            ),
            [],
        )
    CONTROLS[_key][1].append(_bug)

#: A control's examples in the full form (make strength).
CONTROL_EXAMPLES = 60


@pytest.mark.parametrize(
    "control, bugs", CONTROLS.values(), ids=[control.name for control, _ in CONTROLS.values()]
)
def test_the_identity_rewrite_passes(control: Bug, bugs: list[Bug]) -> None:
    """Under COWSTATE_STRENGTH=reduced (make test) as far as the longest hunt of
    its method's bugs went (derandomized, the control meets the same first
    examples), at most CONTROL_EXAMPLES; all of them under full (make strength)."""
    longest = max(examples_to_catch(bug) for bug in bugs)
    examples = control_examples(longest, CONTROL_EXAMPLES)
    machine = machine_for(bad_implementation(control))
    run_state_machine_as_test(machine, settings=settings(HUNT, max_examples=examples))
