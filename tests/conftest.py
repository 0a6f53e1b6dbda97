"""Loads the project's Hypothesis profile (see cowstate_spec.profiles), runs the
map tests over both map implementations, and holds what several test files
share: ``TABLES`` (every heap table type, over both maps) and the
``forced_interleavings`` fixture.

A test module that declares an autouse fixture using ``map_impl`` (see
``bind_map_class``) runs every test once per map: ``python``
(``cowstate.state_map``) and ``c`` (``cowstate._cmap``, when built). A test
marked ``pure_map_internals`` reads the pure map's private fields (or patches
its module) and runs on the pure map only; the C map's structure is judged
through ``cowstate_spec.cmap_view`` by the same checker instead.
"""

from __future__ import annotations

import sys
from collections.abc import Iterator
from typing import Any

import pytest

from cowstate.nested_table import NestedMapsStateTable
from cowstate.state_map import CopyOnWriteStateMap as PureMap
from cowstate.state_table import StateTable
from cowstate_spec.implementations import C_MAP, CMapsTable, PureMapsTable
from cowstate_spec.profiles import load_profile

PROFILE = load_profile()

#: The map classes by implementation name, as ``cowstate.IMPLEMENTATION`` names them.
MAPS: dict[str, type[Any]] = {"python": PureMap}
if C_MAP is not None:
    MAPS["c"] = C_MAP

#: Every heap table type: copy-on-write over each map, and nested dicts (the
#: RocksDB table lives in a backend's database; the tests that take it too build
#: it through ``cowstate_spec.backends``).
TABLES: list[type[StateTable[Any, Any, Any]]] = [PureMapsTable, NestedMapsStateTable]
if C_MAP is not None:
    TABLES.insert(1, CMapsTable)


def pytest_report_header() -> str:
    return (
        f"hypothesis profile: {PROFILE} (set COWSTATE_PROFILE=ci|dev|deep|mutation|"
        f"crosshair); maps under test: {', '.join(MAPS)}"
    )


def pytest_generate_tests(metafunc: pytest.Metafunc) -> None:
    if "map_impl" in metafunc.fixturenames:
        pure_only = metafunc.definition.get_closest_marker("pure_map_internals")
        names = ["python"] if pure_only else list(MAPS)
        metafunc.parametrize("map_impl", names)


def bind_map_class(module_globals: dict[str, Any], map_impl: str) -> None:
    """Point the test module's ``CopyOnWriteStateMap`` at one implementation."""
    module_globals["CopyOnWriteStateMap"] = MAPS[map_impl]


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
