"""The backend state machine must catch heap backends over broken tables.

Each broken backend of ``cowstate_spec.bad_implementations.bad_backends`` puts
one copy-on-write bug (or a synchronous snapshot that forgets to copy) under
a real ``HeapKeyedStateBackend``. Unlike the map bugs, these corrupt a
snapshot only if the owner changes a state while the writer still needs it,
so a run may pass or fail depending on the interleaving: Hypothesis reports
that as ``Flaky``, which counts as caught. The control: the real heap backends
pass the same hunt under the same interleavings.
"""

from __future__ import annotations

import pytest
from hypothesis import settings
from hypothesis.errors import Flaky
from hypothesis.stateful import run_state_machine_as_test

from cowstate.key_groups import KeyGroupRange
from cowstate_spec.backend_machine import MAX_PARALLELISM, backend_machine_for
from cowstate_spec.backends import BACKENDS, BackendImplementation
from cowstate_spec.bad_implementations import bad_backends
from cowstate_spec.profiles import control_examples, hunt, hunt_settings

HUNT = hunt_settings(max_examples=500, stateful_step_count=60)


#: Examples each bad backend's hunt started until its catch, by name (filled
#: by the catch tests; the controls read the longest).
EXAMPLES_TO_CATCH: dict[str, int] = {}


def examples_to_catch(implementation: BackendImplementation) -> int:
    """How many examples of the hunt the backend machine starts until it catches
    ``implementation``'s bug (``cowstate_spec.profiles.hunt``; it fails if the
    hunt passes). Once per bug and process: the catch test and the controls
    share it."""
    if implementation.name not in EXAMPLES_TO_CATCH:
        machine = backend_machine_for(implementation, KeyGroupRange(0, MAX_PARALLELISM - 1))
        EXAMPLES_TO_CATCH[implementation.name] = hunt(machine, HUNT, (AssertionError, Flaky))
    return EXAMPLES_TO_CATCH[implementation.name]


@pytest.mark.parametrize("implementation", bad_backends(), ids=repr)
def test_backend_machine_catches(
    implementation: BackendImplementation, forced_interleavings: None
) -> None:
    assert 0 < examples_to_catch(implementation) <= HUNT.max_examples + 1


@pytest.mark.parametrize(
    "implementation", [b for b in BACKENDS if b.name.startswith("heap")], ids=repr
)
def test_the_real_heap_backends_pass_the_same_hunt(
    implementation: BackendImplementation, forced_interleavings: None
) -> None:
    """Control: with the same settings and interleavings, the real heap backends
    pass, so neither an AssertionError nor a Flaky above is the machine's own.
    Under COWSTATE_STRENGTH=reduced (make test) as far as the longest of the
    hunts went (derandomized, the control meets the same first examples), the
    whole budget under full (make strength)."""
    longest = max(examples_to_catch(bad) for bad in bad_backends())
    examples = control_examples(longest, HUNT.max_examples)
    machine = backend_machine_for(implementation, KeyGroupRange(0, MAX_PARALLELISM - 1))
    run_state_machine_as_test(machine, settings=settings(HUNT, max_examples=examples))
