"""The state machines reach the rare paths the design is about, often.

Each machine runs under the ``ci`` profile (whatever profile the session
loaded: the thresholds are counts of that profile's derandomized examples),
with :data:`cowstate_spec.coverage.EVENTS` counting the rare paths it
reaches; a path reached fewer times than its threshold fails the test.
CONTRIBUTING.md lists the measured counts.
"""

from __future__ import annotations

from collections import Counter

import pytest
from hypothesis import settings
from hypothesis.stateful import run_state_machine_as_test

from cowstate_spec import coverage as cov
from cowstate_spec.implementations import C_MAP, by_name
from cowstate_spec.machine import machine_for

#: Counts measured under ``ci`` (CONTRIBUTING.md, "Coverage you can see"), per
#: machine: (cow-map, c-map, cow-table). A threshold is three quarters of the
#: count, rounded down: a change of strategies that loses a path fails here.
MEASURED: dict[str, tuple[int, int, int]] = {
    cov.SNAPSHOT_IN_REHASH: (65, 20, 0),
    cov.SNAPSHOT_IN_REHASH_STARTED: (55, 14, 0),
    cov.SNAPSHOT_IN_REHASH_LATE: (24, 0, 0),  # c-map: not reached (see CONTRIBUTING)
    cov.SHARED_STATE_COPY["get"]: (12, 26, 2),
    cov.SHARED_STATE_COPY["put_and_get_old"]: (56, 28, 9),
    cov.SHARED_STATE_COPY["remove_and_get_old"]: (29, 14, 13),
    cov.SHARED_STATE_COPY["transform"]: (12, 33, 68),
    cov.CHAIN_COPY_PAST_HEAD: (33, 28, 45),
    cov.REHASH_MOVES_SHARED_ENTRY: (146, 46, 30),
    cov.RELEASE_OUT_OF_ORDER: (77, 38, 19),
    cov.ITERATION_INTERRUPTED_BY_REHASH: (21, 6, 0),
    cov.TABLE_SNAPSHOT_IN_REHASH: (0, 0, 31),
}
MACHINES = ("cow-map", "c-map", "cow-table")


def thresholds(name: str) -> dict[str, int]:
    column = MACHINES.index(name)
    return {path: counts[column] * 3 // 4 for path, counts in MEASURED.items()}


def events_of(name: str) -> Counter[str]:
    """Run the machine of implementation ``name`` under ``ci``; the events it recorded."""
    implementation = by_name(name)
    ci = settings.get_profile("ci")
    examples = max(10, round(ci.max_examples * implementation.example_share))
    cov.EVENTS.clear()
    run_state_machine_as_test(
        machine_for(implementation), settings=settings(ci, max_examples=examples)
    )
    counts = Counter(cov.EVENTS)
    cov.EVENTS.clear()
    return counts


def below(counts: Counter[str], least: dict[str, int]) -> dict[str, tuple[int, int]]:
    return {p: (counts[p], t) for p, t in least.items() if counts[p] < t}


@pytest.mark.parametrize(
    "name", [m for m in MACHINES if m != "c-map" or C_MAP is not None], ids=str
)
def test_machine_reaches_the_rare_paths(name: str) -> None:
    counts = events_of(name)
    least = thresholds(name)
    assert not below(counts, least), (
        f"{name}: paths reached fewer times than their thresholds (count, threshold): "
        f"{below(counts, least)}; all counts: {dict(counts)}"
    )


def test_every_rare_path_has_a_measured_count() -> None:
    assert set(cov.RARE_PATHS) == MEASURED.keys()
