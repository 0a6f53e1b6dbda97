"""The backend state machine must catch a key context that takes an equal key
of another type for the current key (issue 17: ``set_key`` returning early on
``key == self.raw_key`` passed the whole suite before the machine drew such
keys). Under the ``ci`` profile's own settings, deterministic: no hunt needed.
"""

from __future__ import annotations

import pytest
from hypothesis import settings
from hypothesis.stateful import run_state_machine_as_test

from cowstate.key_groups import KeyGroupRange
from cowstate_spec.backend_machine import MAX_PARALLELISM, backend_machine_for
from cowstate_spec.backends import BackendImplementation
from cowstate_spec.bad_key_contexts import KEY_CONTEXT_BUGS, bad_key_context_backends


@pytest.mark.parametrize("implementation", bad_key_context_backends(), ids=repr)
def test_backend_machine_catches(
    implementation: BackendImplementation, forced_interleavings: None
) -> None:
    machine = backend_machine_for(implementation, KeyGroupRange(0, MAX_PARALLELISM - 1))
    with pytest.raises(AssertionError):
        run_state_machine_as_test(machine, settings=settings(settings.get_profile("ci")))


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
