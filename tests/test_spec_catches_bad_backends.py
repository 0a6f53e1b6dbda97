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
from hypothesis.errors import Flaky
from hypothesis.stateful import run_state_machine_as_test

from cowstate.key_groups import KeyGroupRange
from cowstate_spec.backend_machine import MAX_PARALLELISM, backend_machine_for
from cowstate_spec.backends import BACKENDS, BackendImplementation
from cowstate_spec.bad_implementations import bad_backends
from cowstate_spec.profiles import hunt_settings

HUNT = hunt_settings(max_examples=500, stateful_step_count=60)


@pytest.mark.parametrize("implementation", bad_backends(), ids=repr)
def test_backend_machine_catches(
    implementation: BackendImplementation, forced_interleavings: None
) -> None:
    machine = backend_machine_for(implementation, KeyGroupRange(0, MAX_PARALLELISM - 1))
    with pytest.raises((AssertionError, Flaky)):
        run_state_machine_as_test(machine, settings=HUNT)


@pytest.mark.parametrize(
    "implementation", [b for b in BACKENDS if b.name.startswith("heap")], ids=repr
)
def test_the_real_heap_backends_pass_the_same_hunt(
    implementation: BackendImplementation, forced_interleavings: None
) -> None:
    """Control: with the same settings and interleavings, the real heap backends
    pass, so neither an AssertionError nor a Flaky above is the machine's own."""
    machine = backend_machine_for(implementation, KeyGroupRange(0, MAX_PARALLELISM - 1))
    run_state_machine_as_test(machine, settings=HUNT)
