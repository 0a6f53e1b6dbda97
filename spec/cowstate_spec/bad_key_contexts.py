"""Broken key contexts: the backend machine must catch each (issue 17).

Like :mod:`cowstate_spec.bad_implementations`, each bug rewrites one line of
one method, here of :class:`cowstate.keyed_state.KeyContext`, the current key
of every backend; :func:`bad_key_context_backends` puts the broken context
under a real heap backend. ``tests/test_spec_catches_bad_key_contexts.py``
requires the backend machine to fail on each under the ``ci`` profile.
"""

from __future__ import annotations

import functools
from typing import Any

from cowstate.key_groups import KeyGroupRange
from cowstate.keyed_state import KeyContext
from cowstate.state_table import CopyOnWriteStateTable
from cowstate_spec.backends import BackendImplementation, heap_backend
from cowstate_spec.bad_implementations import Bug, broken_class

__all__ = ["KEY_CONTEXT_BUGS", "bad_key_context_backends"]

KEY_CONTEXT_BUGS: list[Bug] = [
    Bug(
        "set-key-returns-early-on-equal-key",
        "set_key",
        "UnhashableKeyError.check(key)",
        "if key == self.raw_key:\n        return\n    UnhashableKeyError.check(key)",
        "True after 1 (1.0, 0.0 and -0.0 ...) is another key: Python's == must not make "
        "it the current key, nor skip its checks",
        KeyContext,
    ),
]


def bad_key_context_backends() -> list[BackendImplementation]:
    """Heap backends whose key context carries one bug of :data:`KEY_CONTEXT_BUGS`."""
    return [
        BackendImplementation(
            f"heap-{bug.name}", functools.partial(_backend_with, broken_class(bug))
        )
        for bug in KEY_CONTEXT_BUGS
    ]


def _backend_with(context_class: type[Any], key_groups: KeyGroupRange, max_parallelism: int) -> Any:
    backend = heap_backend(CopyOnWriteStateTable, key_groups, max_parallelism)
    backend._context.__class__ = context_class  # same slots: only set_key differs
    return backend
