"""Loads the project's Hypothesis profile (see cowstate_spec.profiles), runs the
map tests over both map implementations, and holds what several test files
share: ``TABLES`` (every state table type: copy-on-write over each map, nested
dicts, RocksDB), the ``table_type`` fixture that makes and closes them,
``HEAP_TABLES`` (their heap classes) and the ``forced_interleavings`` fixture.

A test module that declares an autouse fixture using ``map_impl`` (see
``bind_map_class``) runs every test once per map: ``python``
(``cowstate.state_map``) and ``c`` (``cowstate._cmap``, when built). A test
marked ``pure_map_internals`` reads the pure map's private fields (or patches
its module) and runs on the pure map only; the C map's structure is judged
through ``cowstate_spec.cmap_view`` by the same checker instead.

A table test takes ``table_type`` parametrized indirectly over ``TABLES`` (or
over ``table_types(snapshots=True)``, the types with a capability it needs)::

    @pytest.mark.parametrize("table_type", TABLES, indirect=True, ids=repr)
    def test_x(table_type: Tables) -> None:
        table = table_type(KeyGroupRange(0, 7), 8)

A test written to kill mutants of a module (``make mutate``) says so with
``@pytest.mark.kills(module="cowstate.checkpoint.sealed")`` (one marker per
module; the mutants it was written for in its comment). It lives beside the
other tests of the behaviour it pins; ``scripts/mutation.py`` finds it by the
marker (a scope's killers, ``--recheck``), and
``pytest -m "kills(module='cowstate.checkpoint.sealed')"`` runs a module's.
"""

from __future__ import annotations

import sys
from collections.abc import Iterator
from dataclasses import fields
from typing import Any

import pytest
from schedule import GroupScheduling, schedule

from cowstate.key_groups import DEFAULT_LOWER_BOUND_MAX_PARALLELISM, KeyGroupRange
from cowstate.serializers import StateSerializer
from cowstate.state_map import CopyOnWriteStateMap as PureMap
from cowstate.state_meta import StateMetaInfo
from cowstate.state_table import StateTable
from cowstate_spec.implementations import C_MAP, TABLE_TYPES, Capabilities, TableType
from cowstate_spec.profiles import load_profile

PROFILE = load_profile()

#: The map classes by implementation name, as ``cowstate.IMPLEMENTATION`` names them.
MAPS: dict[str, type[Any]] = {"python": PureMap}
if C_MAP is not None:
    MAPS["c"] = C_MAP

#: Every state table type (``cowstate_spec.implementations.TABLE_TYPES``).
TABLES: list[TableType[Any]] = TABLE_TYPES


#: The heap tables' classes (the types a ``StateTable`` subclass makes), for the
#: snapshot-file tests, which write table snapshots and compare the classes.
HEAP_TABLES: list[type[StateTable[Any, Any, Any]]] = [
    t.make for t in TABLES if isinstance(t.make, type) and issubclass(t.make, StateTable)
]


def table_types(**required: bool) -> list[TableType[Any]]:
    """The table types whose capabilities have the values ``required``, e.g.
    ``table_types(snapshots=True)``."""
    known = {f.name for f in fields(Capabilities)}
    if not required.keys() <= known:
        raise ValueError(f"expected capabilities among {sorted(known)}, got {sorted(required)}")
    return [t for t in TABLES if all(getattr(t.capabilities, k) == v for k, v in required.items())]


class Tables:
    """Makes tables of one type for one test, and closes every one at its end."""

    def __init__(self, table_type: TableType[Any]) -> None:
        self.type = table_type
        self.capabilities = table_type.capabilities
        self._made: list[Any] = []

    def __call__(
        self,
        key_group_range: KeyGroupRange | None = None,
        max_parallelism: int = DEFAULT_LOWER_BOUND_MAX_PARALLELISM,
        *,
        meta: StateMetaInfo | None = None,
        key_serializer: StateSerializer | None = None,
    ) -> Any:
        table = self.type(
            key_group_range, max_parallelism, meta=meta, key_serializer=key_serializer
        )
        self._made.append(table)
        return table

    def close(self) -> None:
        while self._made:
            self.type.close(self._made.pop())

    def __repr__(self) -> str:
        return self.type.name


@pytest.fixture
def table_type(request: pytest.FixtureRequest) -> Iterator[Tables]:
    """Tables of the type ``request.param`` (parametrize indirectly), closed at the end."""
    tables = Tables(request.param)
    try:
        yield tables
    finally:
        tables.close()


def pytest_configure(config: pytest.Config) -> None:
    # Registered here, not in pyproject.toml: the mutation scopes' staged
    # projects (scripts/mutation.py) have a pyproject of their own.
    config.addinivalue_line(
        "markers",
        "kills(module): written to kill mutants of the module (dotted, "
        "e.g. module='cowstate.checkpoint.sealed'); scripts/mutation.py selects by it",
    )


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    """The workers' groups, heaviest first (``tests/schedule.py``)."""
    schedule(items)


def pytest_xdist_make_scheduler(config: pytest.Config, log: Any) -> Any:
    """``--dist loadgroup``: the groups of ``tests/schedule.py``."""
    if config.getvalue("dist") == "loadgroup":
        return GroupScheduling(config, log)
    return None


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
