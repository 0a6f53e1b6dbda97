"""Loads the project's Hypothesis profile (see cowstate_spec.profiles), and what
several test files share: ``TABLES`` (every heap table type) and the
``forced_interleavings`` fixture."""

from __future__ import annotations

import sys
from collections.abc import Iterator

import pytest

from cowstate.nested_table import NestedMapsStateTable
from cowstate.state_table import CopyOnWriteStateTable, StateTable
from cowstate_spec.profiles import load_profile

PROFILE = load_profile()

#: Every heap table type (the RocksDB table lives in a backend's database; the
#: tests that take it too build it through ``cowstate_spec.backends``).
TABLES: list[type[StateTable[object, object, object]]] = [CopyOnWriteStateTable,
                                                           NestedMapsStateTable]


def pytest_report_header() -> str:
    return f"hypothesis profile: {PROFILE} (set COWSTATE_PROFILE=ci|dev|deep|mutation|crosshair)"


@pytest.fixture
def forced_interleavings() -> Iterator[None]:
    """Switch threads every microsecond instead of every 5 ms, so a writer thread
    and the owner interleave at many more points."""
    previous = sys.getswitchinterval()
    sys.setswitchinterval(1e-6)
    try:
        yield
    finally:
        sys.setswitchinterval(previous)
