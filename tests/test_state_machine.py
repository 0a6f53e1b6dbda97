"""The state machine of cowstate_spec.machine, over every implementation.

A run goes through ``cowstate_spec.coverage.run_counted``: a derandomized run
(the ``ci`` profile) the coverage test already made passes without running
again, and the other way round (tests/test_coverage_events.py).

The runs of :data:`REDUCED` take a share of the examples the others take.
Measured under ``ci`` (2026-11-28, coverage.py with branches over
``cowstate`` and ``cowstate_model``, gcov over the C map and its probe), the
reduced runs together reach every line and branch of the Python packages
the same runs at full length reach, and of the C map all but four branches
of the collector's traversal and clear functions (which the collector
reaches when its generations fill, not by the examples; the C map's tests
reach them); each run alone loses at most a line and four branches, which
another run reaches. The runs the coverage test counts (``cow-map``, ``c-map``,
``cow-table``: tests/test_coverage_events.py) and the RocksDB tables (the
sub-range run at half never completes a transform) keep every example.
"""

import pytest
from hypothesis import settings

from cowstate_spec.coverage import run_counted
from cowstate_spec.implementations import C_MAP, IMPLEMENTATIONS, Implementation
from cowstate_spec.machine import machine_for

#: The share of its examples a run takes (see the module doc): the maps at
#: Flink's default capacity (128: rehashes come late, the small maps hold
#: the rare paths), the tables but the counted one, and the model against
#: itself.
REDUCED = {
    "cow-map-128": 1 / 2,
    "c-map-128": 1 / 2,
    "reference-model": 1 / 4,
    "c-table": 1 / 2,
    "cow-table-sub-range": 1 / 2,
    "c-table-sub-range": 1 / 2,
    "nested-table": 1 / 2,
    "nested-table-sub-range": 1 / 2,
}


@pytest.mark.parametrize("implementation", IMPLEMENTATIONS, ids=repr)
def test_implementation_agrees_with_the_model(implementation: Implementation) -> None:
    current = settings()
    share = implementation.example_share * REDUCED.get(implementation.name, 1.0)
    examples = max(10, round(current.max_examples * share))
    run_counted(machine_for(implementation), settings(current, max_examples=examples))


def test_every_reduced_run_names_an_implementation() -> None:
    names = {i.name for i in IMPLEMENTATIONS}
    unknown = {name for name in REDUCED if name not in names}
    if C_MAP is None:  # without the C map its runs are not made at all
        unknown -= {"c-map-128", "c-table", "c-table-sub-range"}
    assert not unknown, f"REDUCED names no implementation: {sorted(unknown)}"
