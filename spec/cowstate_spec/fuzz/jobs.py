"""The state the fuzzers snapshot: backends of every kind of state, filled the
same way every run, and what they held, as the fuzz cases compare it.

Small on purpose (16 key groups, a few dozen keys, two namespaces, five
states): a case's cost is its restore, and a small file still has every
region of the format many times over.
"""

from __future__ import annotations

import copy
import os
from collections.abc import Sequence
from typing import Any

from cowstate.descriptors import StateDescriptor, ValueStateDescriptor
from cowstate.heap_backend import HeapKeyedStateBackend
from cowstate.heap_incremental import IncrementalOptions
from cowstate.key_groups import KeyGroupRange, compute_key_group_range_for_operator_index
from cowstate.keyed_state import VOID_NAMESPACE
from cowstate_model.key_groups import assign_to_key_group
from cowstate_spec.backends import DESCRIPTORS
from cowstate_spec.fuzz.outcomes import View, canon
from cowstate_spec.implementations import PureMapsTable
from cowstate_spec.kinds import KINDS

__all__ = [
    "EXTRA",
    "KEYS",
    "MAX_PARALLELISM",
    "NAMESPACES",
    "STATES",
    "Original",
    "expected_views",
    "fill",
    "new_backend",
    "original_of",
    "prefill",
    "remove",
    "subtask_ranges",
]

MAX_PARALLELISM = 16
#: One state of each kind (``cowstate_spec.kinds``).
STATES: tuple[StateDescriptor, ...] = tuple(DESCRIPTORS.values())
#: A state a backend that "already holds state" has besides the snapshot's.
EXTRA: ValueStateDescriptor[Any] = ValueStateDescriptor("extra")
#: One key type per backend (``cowstate.key_types``): ints only, of every
#: hash Flink gives an int (Integer, Long, beyond int64: the key's bytes).
KEYS: tuple[Any, ...] = (*range(18), 2**31, -(2**40), 10**20, 123_456_789, 2**63 - 1, -7)
NAMESPACES: tuple[Any, ...] = (VOID_NAMESPACE, "w1")

#: What a snapshot holds: (state name, key group, key, namespace, state).
Original = tuple[tuple[str, int, Any, Any, Any], ...]


def subtask_ranges(parallelism: int) -> list[KeyGroupRange]:
    return [
        compute_key_group_range_for_operator_index(MAX_PARALLELISM, parallelism, i)
        for i in range(parallelism)
    ]


def new_backend(kind: str, key_group_range: KeyGroupRange, local_dir: str | None = None) -> Any:
    """A heap, incremental heap (``heap-incremental``: tables over the pure map,
    which tracks changes; a base and up to 10 deltas) or RocksDB backend (RocksDB's instance under
    ``local_dir``)."""
    if kind == "heap":
        return HeapKeyedStateBackend(key_group_range, MAX_PARALLELISM)
    if kind == "heap-incremental":
        return HeapKeyedStateBackend(
            key_group_range,
            MAX_PARALLELISM,
            table_factory=PureMapsTable,
            # deltas of a small job outweigh its base soon: never full for that
            incremental=IncrementalOptions(max_delta_ratio=100.0),
        )
    from cowstate.rocksdb.backend import RocksDBKeyedStateBackend

    if local_dir is not None:
        os.makedirs(local_dir, exist_ok=True)
    return RocksDBKeyedStateBackend(key_group_range, MAX_PARALLELISM, local_dir=local_dir)


def fill(backends: Sequence[Any], round_: int, keys: Sequence[Any] = KEYS) -> None:
    """Give every key of ``keys`` some states (which ones, and in which
    namespaces, vary with the key); ``round_`` changes every value."""
    handles = [{d.name: b.get_state(d) for d in STATES} for b in backends]
    for i, key in enumerate(keys):
        index = _owner(backends, key)
        backend, states = backends[index], handles[index]
        backend.set_current_key(key)
        for namespace in NAMESPACES[: 1 + i % 2]:
            backend.set_current_namespace(namespace)
            for name, kind in KINDS.items():  # each kind's fill (cowstate_spec.kinds)
                kind.fill(states[name], round_, i, key)


def remove(backends: Sequence[Any], keys: Sequence[Any]) -> None:
    """Clear every state of each of ``keys`` (every other key: in one namespace
    only): what an incremental checkpoint records as removals."""
    handles = [[b.get_state(d) for d in STATES] for b in backends]
    for i, key in enumerate(keys):
        index = _owner(backends, key)
        backends[index].set_current_key(key)
        for namespace in NAMESPACES[i % 2 :]:
            backends[index].set_current_namespace(namespace)
            for state in handles[index]:
                state.clear()


def prefill(backend: Any) -> None:
    """State a backend holds before a restore that must replace it (or change
    nothing): the snapshot's states with other values, and one more."""
    fill(
        [backend],
        99,
        [k for k in KEYS if _group(k) in backend.key_group_range][:6],
    )
    extra = backend.get_state(EXTRA)
    for key in KEYS:
        if _group(key) in backend.key_group_range:
            backend.set_current_key(key)
            backend.set_current_namespace(VOID_NAMESPACE)
            extra.update(("extra", key))


def original_of(backends: Sequence[Any]) -> Original:
    """Every mapping the backends hold (what a snapshot taken now holds), deep
    copied: the heap hands out its live state objects, which later writes may
    change in place."""
    rows = []
    for backend in backends:
        for name in backend.state_names:
            for key, namespace, state in backend.entries(name):
                group = assign_to_key_group(key, MAX_PARALLELISM)
                rows.append((name, group, key, namespace, copy.deepcopy(state)))
    return tuple(rows)


def expected_views(original: Original, ranges: Sequence[KeyGroupRange]) -> list[View]:
    """The view (:func:`~cowstate_spec.fuzz.outcomes.view_of`) each backend of
    ``ranges`` has after restoring exactly ``original``."""
    return [_expected_view(original, r.start_key_group, r.end_key_group) for r in ranges]


#: (id of an original, start, end) -> (the original, kept alive; its view).
_VIEWS: dict[tuple[int, int, int], tuple[Original, View]] = {}


def _expected_view(original: Original, start: int, end: int) -> View:
    cached = _VIEWS.get((id(original), start, end))
    if cached is not None and cached[0] is original:
        return cached[1]
    view = tuple(
        sorted(
            (name, canon(key), canon(namespace), canon(state))
            for name, group, key, namespace, state in original
            if start <= group <= end
        )
    )
    if len(_VIEWS) > 1024:
        _VIEWS.clear()
    _VIEWS[id(original), start, end] = (original, view)
    return view


#: The key group of every key of :data:`KEYS`.
_GROUPS: dict[Any, int] = {key: assign_to_key_group(key, MAX_PARALLELISM) for key in KEYS}


def _group(key: Any) -> int:
    group = _GROUPS.get(key)
    return assign_to_key_group(key, MAX_PARALLELISM) if group is None else group


def _owner(backends: Sequence[Any], key: Any) -> int:
    group = _group(key)
    return next(i for i, b in enumerate(backends) if group in b.key_group_range)
