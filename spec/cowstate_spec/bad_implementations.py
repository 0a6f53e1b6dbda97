"""Deliberately broken maps: the specification proves its strength on them.

Like Hypothesis' own "bad machines", each entry is one plausible bug in
``CopyOnWriteStateMap``, made by rewriting one line of one method's source
(so the broken class differs from the real one in exactly that line). The
test ``tests/test_spec_catches_bad_implementations.py`` runs the state machine
on each and requires it to fail; a bug the spec cannot see is a hole in the
spec.
"""

from __future__ import annotations

import inspect
import textwrap
from dataclasses import dataclass
from typing import Any

from cowstate import CopyOnWriteStateMap
from cowstate import state_map as state_map_module
from cowstate_spec.implementations import Implementation
from cowstate_spec.invariants import check_map, fingerprint, rehash_step_check


@dataclass(frozen=True)
class Bug:
    """Replace ``old`` by ``new`` (exactly one occurrence) in ``method``."""

    name: str
    method: str
    old: str
    new: str
    why: str


BUGS: list[Bug] = [
    Bug("get-skips-state-copy", "_copy_state_for_caller",
        "state = self._serializer.copy(e.state)", "state = e.state",
        "rule S: a caller mutates a state an open snapshot still holds"),
    Bug("get-fast-path-ignores-versions", "get",
        "if e.state_version < self._highest_required:", "if False:",
        "rule S on the hot path of get"),
    Bug("chain-copy-mutates-shared-predecessor", "_copy_chain",
        "if current.entry_version < required:\n            copy.next",
        "if current is until:\n            copy.next",
        "rule E: a shared predecessor is relinked instead of copied"),
    Bug("chain-copy-keeps-shared-head", "_copy_chain",
        "copy = current.copy(version)\n        tab[index] = copy",
        "copy = current",
        "rule E: the shared chain head is changed in place"),
    Bug("put-changes-shared-entry", "_put_entry",
        "if e.entry_version < self._highest_required:", "if False:",
        "rule E on put: a snapshot's entry gets the new state"),
    Bug("remove-relinks-shared-predecessor", "_remove_entry",
        "if prev.entry_version < self._highest_required:", "if False:",
        "rule E on remove: the snapshot loses the removed entry's successors"),
    Bug("put-and-get-old-returns-shared-state", "put_and_get_old",
        "old = self._serializer.copy(old)", "pass",
        "rule S: the old state handed out is still in a snapshot"),
    Bug("remove-and-get-old-returns-shared-state", "remove_and_get_old",
        "return self._serializer.copy(e.state)", "return e.state",
        "rule S: the removed state handed out is still in a snapshot"),
    Bug("transform-mutates-shared-state", "transform",
        "old = self._serializer.copy(old)", "pass",
        "rule S: transform's function mutates a snapshot's state"),
    Bug("rehash-relinks-shared-entries", "_incremental_rehash",
        "if e.entry_version < required:", "if False:",
        "rule E in the rehash: moving an entry rewrites a snapshot's chain"),
    Bug("snapshot-omits-moved-high-half", "_snapshot_arrays",
        "self._rehash, self._rehash_index",
        "None if self._rehash is None else self._rehash[:len(self._primary)], "
        "self._rehash_index",
        "the snapshot layout drops buckets j + L of the rehash table"),
    Bug("release-keeps-lowest-version", "_release_version",
        "highest_required_version(self._open_versions)",
        "min(self._open_versions, default=0)",
        "H must be the highest open version, not the lowest"),
    Bug("select-active-table-off-by-one", "_select",
        "in_rehash_table(h, capacity, self._rehash_index)",
        "in_rehash_table(h, capacity, self._rehash_index + 1)",
        "a bucket is looked up in the rehash table before it moved"),
    Bug("rehash-forgets-moved-count", "_incremental_rehash",
        "self._rehash_size += moved", "self._rehash_size += moved - 1",
        "per-table counters drift (invariant 3)"),
    Bug("never-grows", "_put_entry", "self._double_capacity()", "pass",
        "the table never grows: invisible to the model, caught by invariant 9"),
    Bug("new-entry-not-at-head", "_put_entry",
        "e = _Entry(key, namespace, None, h, tab[index], version, version)\n"
        "    tab[index] = e",
        "e = _Entry(key, namespace, None, h, None, version, version)\n"
        "    tab[index] = e",
        "a new entry replaces the chain it heads"),
]


def broken_class(bug: Bug) -> type[CopyOnWriteStateMap[Any, Any, Any]]:
    """``CopyOnWriteStateMap`` with ``bug`` applied to one method."""
    source = textwrap.dedent(inspect.getsource(getattr(CopyOnWriteStateMap, bug.method)))
    if source.count(bug.old) != 1:
        raise ValueError(
            f"bug {bug.name}: expected exactly one {bug.old!r} in {bug.method}, "
            f"found {source.count(bug.old)}")
    namespace = dict(vars(state_map_module))
    exec(compile(source.replace(bug.old, bug.new), f"<bug {bug.name}>", "exec"), namespace)
    return type(f"Broken_{bug.name.replace('-', '_')}", (CopyOnWriteStateMap,),
                {bug.method: namespace[bug.method], "__slots__": ()})


def bad_implementation(bug: Bug, capacity: int = 4) -> Implementation:
    """The broken map as an implementation the state machine can check."""
    cls = broken_class(bug)

    def factory(initial_capacity: int = capacity) -> CopyOnWriteStateMap[Any, Any, Any]:
        return cls(initial_capacity=initial_capacity)

    return Implementation(f"bad-{bug.name}", factory, check_map, fingerprint,
                          rehash_step_check)
