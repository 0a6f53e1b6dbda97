"""Coverage you can see: which rare paths of the map a state machine reached.

The design is about a few paths a random walk rarely takes: a snapshot taken
in the middle of a rehash, a state copied because a snapshot shares it
(rule S), a chain copied past its head (rule E), a rehash relinking a shared
entry, a release out of order, an iterator that a rehash step interrupts. The
state machines (:mod:`cowstate_spec.machine`, :mod:`cowstate_spec.
backend_machine`) name each one they reach with :func:`record`: a Hypothesis
``event()`` (shown by ``pytest --hypothesis-show-statistics``) and a count in
:data:`EVENTS`, which ``tests/test_coverage_events.py`` holds to thresholds.

Every path is detected from the outside, by reading the map's structure
before and after an operation (the pure map's fields, or the C map's export
through :mod:`cowstate_spec.cmap_view`): nothing in ``impl/`` is instrumented.
A path is recorded when the structure shows its condition held -- for rule S,
the mapping's ``state_version`` was below ``H`` when the operation began; for
a chain copy, a live entry stands for an entry of the same mapping that was
replaced by a copy, at a chain position past the head, and was not moved by
the rehash step; for a rehash, an entry of a bucket the step moved had
``entry_version < H``; for the backend, the owner's state operation found the
current key group's map with a snapshot version open while a writer was
pending.
"""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass
from typing import Any

from hypothesis import currently_in_test_context, event, settings
from hypothesis.stateful import RuleBasedStateMachine, run_state_machine_as_test

from cowstate_spec.cmap_view import rehash_progress, view_of

__all__ = [
    "CHAIN_COPY_PAST_HEAD",
    "COUNTED",
    "EVENTS",
    "ITERATION_INTERRUPTED_BY_REHASH",
    "RARE_PATHS",
    "REHASH_MOVES_SHARED_ENTRY",
    "RELEASE_OUT_OF_ORDER",
    "SHARED_STATE_COPY",
    "SNAPSHOT_IN_REHASH",
    "SNAPSHOT_IN_REHASH_LATE",
    "SNAPSHOT_IN_REHASH_STARTED",
    "TABLE_SNAPSHOT_IN_REHASH",
    "WRITER_AND_OWNER_SAME_KEY_GROUP",
    "MapState",
    "is_late_in_rehash",
    "is_rehashing",
    "record",
    "record_keyed_operation",
    "record_snapshot",
    "rehash_state",
    "run_counted",
]

SNAPSHOT_IN_REHASH = "snapshot during a rehash"
SNAPSHOT_IN_REHASH_STARTED = "snapshot during a rehash with r > 0"
SNAPSHOT_IN_REHASH_LATE = "snapshot during a rehash with r >= 3L/4"
#: Rule S on each operation that hands a state out: the label per operation.
SHARED_STATE_COPY = {
    op: f"shared state copied by {op}"
    for op in ("get", "put_and_get_old", "remove_and_get_old", "transform")
}
CHAIN_COPY_PAST_HEAD = "chain copied past its head"
REHASH_MOVES_SHARED_ENTRY = "rehash step moved a shared entry"
RELEASE_OUT_OF_ORDER = "release out of order with others open"
ITERATION_INTERRUPTED_BY_REHASH = "iteration interrupted by a rehash step"
TABLE_SNAPSHOT_IN_REHASH = "table snapshot with a key group's map rehashing"
WRITER_AND_OWNER_SAME_KEY_GROUP = "owner touches a key group a pending writer holds"

#: Every rare path the machines record.
RARE_PATHS: tuple[str, ...] = (
    SNAPSHOT_IN_REHASH,
    SNAPSHOT_IN_REHASH_STARTED,
    SNAPSHOT_IN_REHASH_LATE,
    *SHARED_STATE_COPY.values(),
    CHAIN_COPY_PAST_HEAD,
    REHASH_MOVES_SHARED_ENTRY,
    RELEASE_OUT_OF_ORDER,
    ITERATION_INTERRUPTED_BY_REHASH,
    TABLE_SNAPSHOT_IN_REHASH,
    WRITER_AND_OWNER_SAME_KEY_GROUP,
)

#: How often each label was recorded in this process (reset by the coverage test).
EVENTS: Counter[str] = Counter()


def run_counted(machine: type[RuleBasedStateMachine], run_settings: settings) -> Counter[str]:
    """Run ``machine`` under ``run_settings``; the rare paths it recorded.

    A derandomized run replays the same examples every time, so its outcome
    and counts are known once it passed: a second call with the same machine
    (by name) and settings in this process returns the first one's counts
    without running it again. The machine tests and the coverage test share
    one ``ci`` run that way, whichever comes first. A failing run raises and
    is not remembered; a randomized one is never reused.
    """
    key = (
        machine.__name__,
        run_settings.max_examples,
        run_settings.stateful_step_count,
        run_settings.backend,
    )
    if run_settings.derandomize and key in _PASSED:
        return Counter(_PASSED[key])
    EVENTS.clear()
    try:
        run_state_machine_as_test(machine, settings=run_settings)
        counts = Counter(EVENTS)
    finally:
        EVENTS.clear()
    if run_settings.derandomize:
        _PASSED[key] = Counter(counts)
    return counts


#: The counts of the derandomized runs that passed, by machine and settings.
_PASSED: dict[tuple[str, int, int, str], Counter[str]] = {}

#: The implementations whose machines detect the keyed operations' paths (the
#: structure before and after each one: a quarter of a machine's time); the
#: others record only what costs nothing (snapshots in a rehash, releases, iterators).
COUNTED = frozenset({"cow-map", "c-map", "cow-table"})


def record(label: str) -> None:
    """Name one rare path: a Hypothesis event (inside a Hypothesis test; a
    replayed step list runs outside one) and a count in :data:`EVENTS`."""
    if currently_in_test_context():
        event(label)
    EVENTS[label] += 1


@dataclass(frozen=True)
class _Entry:
    entry: Any  # the entry object (an EntryView for the C map: interned by address)
    entry_version: int
    state_version: int
    in_rehash_table: bool
    bucket: int
    position: int  # in its chain, head = 0


class MapState:
    """The structure of one copy-on-write map at one moment (pure or C)."""

    def __init__(self, m: Any) -> None:
        view = view_of(m)
        self.required: int = view._highest_required
        self.rehashing = view._rehash is not None
        self.rehash_index: int = view._rehash_index
        self.capacity = len(view._primary)
        self.entries: dict[tuple[Any, Any], _Entry] = {}
        for in_rehash, table in ((False, view._primary), (True, view._rehash or [])):
            for bucket, head in enumerate(table):
                e, position = head, 0
                while e is not None:
                    self.entries[(e.key, e.namespace)] = _Entry(
                        e, e.entry_version, e.state_version, in_rehash, bucket, position
                    )
                    e, position = e.next, position + 1

    def moved_by_step(self, after: MapState) -> list[_Entry]:
        """The entries of ``self`` that a rehash step between it and ``after`` moved."""
        if not self.rehashing:
            return []
        finished = not after.rehashing or after.capacity != self.capacity
        end = self.capacity if finished else after.rehash_index
        return [
            e
            for e in self.entries.values()
            if not e.in_rehash_table and self.rehash_index <= e.bucket < end
        ]


def rehash_state(m: Any) -> tuple[bool, bool]:
    """(``m`` is rehashing, it rehashes with ``r >= 3L/4``), from one reading."""
    progress = rehash_progress(m)
    if progress is None:
        return (False, False)
    return (True, 4 * progress[0] >= 3 * progress[1])


def is_rehashing(m: Any) -> bool:
    """True while ``m`` (a pure or C copy-on-write map) is rehashing."""
    return rehash_progress(m) is not None


def is_late_in_rehash(m: Any) -> bool:
    """True while ``m`` rehashes with its index ``r >= 3L/4`` (``L`` the old length)."""
    progress = rehash_progress(m)
    return progress is not None and 4 * progress[0] >= 3 * progress[1]


def record_snapshot(m: Any) -> None:
    """Before ``m.snapshot()``: a snapshot inside a rehash, and how far it got."""
    progress = rehash_progress(m)
    if progress is None:
        return
    record(SNAPSHOT_IN_REHASH)
    r, capacity = progress
    if r > 0:
        record(SNAPSHOT_IN_REHASH_STARTED)
    if 4 * r >= 3 * capacity:
        record(SNAPSHOT_IN_REHASH_LATE)


def record_keyed_operation(
    operation: str, kn: tuple[Any, Any], before: MapState, after: MapState
) -> None:
    """After a successful keyed ``operation`` on ``kn``: the rare paths it took."""
    shared = before.entries.get(kn)
    label = SHARED_STATE_COPY.get(operation)
    if label and shared is not None and shared.state_version < before.required:
        record(label)  # rule S
    moved = before.moved_by_step(after)
    if any(e.entry_version < before.required for e in moved):
        record(REHASH_MOVES_SHARED_ENTRY)
    moved_keys = {(e.entry.key, e.entry.namespace) for e in moved}
    for kn_after, e in after.entries.items():
        old = before.entries.get(kn_after)
        if (
            old is not None
            and e.entry is not old.entry
            and e.position > 0
            and kn_after not in moved_keys
        ):
            record(CHAIN_COPY_PAST_HEAD)  # rule E reached past the chain's head
            return
