"""The shared-state registry (``cowstate.checkpoint.registry``): for every
shared file, the set of retained checkpoints that use it.

- ``register(N, files)`` takes a checkpoint id once; a second registration is
  refused and changes nothing;
- ``unregister(N)`` forgets N and returns the paths no retained checkpoint
  uses any more -- only the owned ones: a file ``disown``-ed (a snapshot
  restored in NO_CLAIM or LEGACY mode) is never returned for deletion;
- ``users(path)``, ``checkpoints``, ``paths`` and the repr say what it holds.

The tests marked ``kills`` were written to kill mutants of the module
(``make mutate SCOPE=checkpoint``); their comments name the mutants.
"""

from __future__ import annotations

import pytest

from cowstate.checkpoint.registry import SharedStateRegistry
from cowstate.errors import InvalidArgumentError


@pytest.mark.kills(module="cowstate.checkpoint.registry")
def test_users_names_every_retained_checkpoint_that_uses_a_path() -> None:
    # registry.users__mutmut_1..5: no caller in the library runs users().
    registry = SharedStateRegistry()
    registry.register(1, ["job/shared/a", "job/shared/b"])
    registry.register(2, ["job/shared/b"])
    assert registry.users("job/shared/a") == frozenset({1})
    assert registry.users("job/shared/b") == frozenset({1, 2})
    assert registry.users("job/shared/unknown") == frozenset()
    assert isinstance(registry.users("job/shared/unknown"), frozenset)
    assert registry.unregister(1) == ["job/shared/a"]
    assert registry.users("job/shared/a") == frozenset()
    assert registry.users("job/shared/b") == frozenset({2})


@pytest.mark.kills(module="cowstate.checkpoint.registry")
def test_unregister_forgets_the_checkpoint() -> None:
    # registry.unregister__mutmut_1 (discard(None)): the registry kept listing a
    # subsumed checkpoint, and refused to register its id again.
    registry = SharedStateRegistry()
    registry.register(1, ["job/shared/a"])
    registry.register(2, ["job/shared/a"])
    assert registry.unregister(1) == []
    assert registry.checkpoints == frozenset({2})
    registry.register(1, ["job/shared/b"])
    assert registry.checkpoints == frozenset({1, 2})


@pytest.mark.kills(module="cowstate.checkpoint.registry")
def test_unregister_returns_owned_unused_paths_and_never_disowned_ones() -> None:
    # registry.unregister__mutmut_7 (`path in self._not_owned`): deleted the files
    # of a NO_CLAIM snapshot and leaked the job's own; the reduced storage
    # machine did not subsume a checkpoint holding both within its examples.
    registry = SharedStateRegistry()
    registry.register(1, ["job/shared/own", "old/shared/theirs"])
    registry.disown(["old/shared/theirs"])
    assert not registry.is_owned("old/shared/theirs")
    assert registry.is_owned("job/shared/own")
    assert registry.unregister(1) == ["job/shared/own"]
    assert registry.paths == frozenset()


@pytest.mark.kills(module="cowstate.checkpoint.registry")
def test_registering_a_checkpoint_twice_is_refused_and_changes_nothing() -> None:
    # registry.register__mutmut_2 (message None), __mutmut_3 (`add(None)`: the
    # registry never knew which checkpoints it had, so it took the id twice).
    registry = SharedStateRegistry()
    registry.register(3, ["job/shared/a"])
    assert registry.checkpoints == frozenset({3})
    with pytest.raises(InvalidArgumentError) as caught:
        registry.register(3, ["job/shared/b"])
    assert str(caught.value) == "expected checkpoint 3 to be registered once, it already is"
    assert registry.paths == frozenset({"job/shared/a"})
    assert registry.users("job/shared/a") == frozenset({3})


@pytest.mark.kills(module="cowstate.checkpoint.registry")
def test_registry_repr_counts_files_and_lists_checkpoints() -> None:
    # registry.__repr____mutmut_1
    registry = SharedStateRegistry()
    registry.register(2, ["j/shared/x", "j/shared/y"])
    registry.register(1, ["j/shared/y"])
    assert repr(registry) == "<SharedStateRegistry 2 files, checkpoints [1, 2]>"
