"""The backend state machine must catch a key context that takes an equal key
of another type for the current key (issue 17: ``set_key`` returning early on
``key == self.raw_key`` passed the whole suite before the machine drew such
keys). Within the ``ci`` profile's examples and steps, generation only (no
shrinking of the failure, which took most of a minute), as every hunt runs.
"""

from __future__ import annotations

import pytest
from hypothesis import settings

from cowstate.key_groups import KeyGroupRange
from cowstate_spec.backend_machine import MAX_PARALLELISM, backend_machine_for
from cowstate_spec.backends import BackendImplementation
from cowstate_spec.bad_key_contexts import KEY_CONTEXT_BUGS, bad_key_context_backends
from cowstate_spec.profiles import hunt, hunt_settings

CI = settings.get_profile("ci")


@pytest.mark.parametrize("implementation", bad_key_context_backends(), ids=repr)
def test_backend_machine_catches(
    implementation: BackendImplementation, forced_interleavings: None
) -> None:
    machine = backend_machine_for(implementation, KeyGroupRange(0, MAX_PARALLELISM - 1))
    caught_after = hunt(
        machine, hunt_settings(CI.max_examples, CI.stateful_step_count), (AssertionError,)
    )
    assert 0 < caught_after <= CI.max_examples + 1


def test_the_bug_is_planted() -> None:
    """Control: the broken context differs from the real one, and only there."""
    (implementation,) = bad_key_context_backends()
    backend = implementation.factory(KeyGroupRange(0, 0), 1)
    try:
        backend.set_current_key(1)
        backend.set_current_key(True)  # the real context refuses: another key type
        assert type(backend.current_key) is int
    finally:
        backend.close()
    assert [bug.name for bug in KEY_CONTEXT_BUGS] == ["set-key-returns-early-on-equal-key"]
