"""The two implementations of the copy-on-write state map, as the benchmarks see them.

* ``PURE_MAP`` is ``cowstate.state_map.CopyOnWriteStateMap``, the pure-Python
  map, always importable (imported from its module, never through
  ``cowstate.CopyOnWriteStateMap``, which is the C map when that is built).
* ``C_MAP`` is ``cowstate._cmap.CopyOnWriteStateMap``, the C extension, or
  ``None`` when it is not built (``C_MAP_ERROR`` then says why). The
  benchmarks print its column as :data:`NOT_BUILT` in that case. It is imported
  directly, so it is measured even under ``COWSTATE_PURE_PYTHON=1``.
* :func:`table_factory` builds a ``CopyOnWriteStateTable`` subclass whose
  key-group maps are of one chosen implementation (it sets the table's
  ``map_class``, which defaults to ``cowstate.CopyOnWriteStateMap``), so one
  process can compare tables and heap backends over both maps.
* :func:`settle` drives a map's incremental rehash to its end, so that
  measurements see the steady state.
* :func:`load_cmap_build` loads another build of the C map (a ``_cmap*.so``
  of another commit) under a private name, beside ``cowstate._cmap``.
"""

from __future__ import annotations

import importlib
import importlib.machinery
import importlib.util
from collections.abc import Callable
from typing import Any, Protocol

import cowstate
from cowstate.introspection import describe
from cowstate.state_map import CopyOnWriteStateMap as _PureMap
from cowstate.state_table import CopyOnWriteStateTable

__all__ = [
    "C_MAP",
    "C_MAP_ERROR",
    "DEFAULT_IMPLEMENTATION",
    "NOT_BUILT",
    "PURE_MAP",
    "MapSnapshot",
    "StateMapLike",
    "implementation_summary",
    "is_rehashing",
    "load_cmap_build",
    "map_class",
    "settle",
    "table_factory",
]

NOT_BUILT = "n/a (not built)"
PY = "python"
C = "c"


class MapSnapshot(Protocol):
    """What the benchmarks use of a map snapshot."""

    def release(self) -> None: ...

    def __len__(self) -> int: ...


class StateMapLike(Protocol):
    """What the benchmarks use of a map (both implementations have it all)."""

    def get(self, key: Any, namespace: Any) -> Any: ...

    def put(self, key: Any, namespace: Any, state: Any) -> None: ...

    def contains_key(self, key: Any, namespace: Any) -> bool: ...

    def snapshot(self) -> Any: ...

    def __len__(self) -> int: ...


MapClass = Callable[..., Any]

PURE_MAP: MapClass = _PureMap


def _load_c_map() -> tuple[MapClass | None, str]:
    try:
        module = importlib.import_module("cowstate._cmap")
    except ImportError as exc:
        return None, f"{type(exc).__name__}: {exc}"
    cls = getattr(module, "CopyOnWriteStateMap", None)
    if cls is None:
        return None, "cowstate._cmap has no CopyOnWriteStateMap"
    return cls, ""


C_MAP, C_MAP_ERROR = _load_c_map()

#: what ``cowstate.CopyOnWriteStateMap`` is in this process ("c" or "python")
DEFAULT_IMPLEMENTATION: str = str(getattr(cowstate, "IMPLEMENTATION", PY))


def load_cmap_build(path: str, package: str) -> MapClass:
    """The C map class of the ``_cmap`` build at ``path``, loaded as
    ``<package>._cmap`` (its init function is found by the name's last part,
    ``_cmap``), so several builds live in one process beside ``cowstate._cmap``."""
    loader = importlib.machinery.ExtensionFileLoader(f"{package}._cmap", path)
    spec = importlib.util.spec_from_file_location(loader.name, path, loader=loader)
    if spec is None:
        raise SystemExit(f"expected a _cmap extension at {path}")
    module = importlib.util.module_from_spec(spec)
    loader.exec_module(module)
    found: MapClass = module.CopyOnWriteStateMap
    return found


def implementation_summary() -> str:
    c = (
        "cowstate._cmap.CopyOnWriteStateMap built"
        if C_MAP is not None
        else f"C map not built ({C_MAP_ERROR})"
    )
    return f"{c}; cowstate.IMPLEMENTATION = {DEFAULT_IMPLEMENTATION!r}"


def map_class(impl: str) -> MapClass | None:
    """The map class of ``impl`` ("c" or "python"), None if not built."""
    if impl == PY:
        return PURE_MAP
    if impl == C:
        return C_MAP
    raise ValueError(f"expected 'c' or 'python', got {impl!r}")


def is_rehashing(m: Any) -> bool | None:
    """Whether ``m`` is in an incremental rehash; None for the C map, which
    can only tell through its structure export (``describe``), and that builds
    Python objects for every entry: far too slow and big for a benchmark."""
    if isinstance(m, _PureMap):
        return describe(m).is_rehashing
    return None


def settle(m: StateMapLike, probe_namespace: Any) -> None:
    """Drive ``m``'s incremental rehash to its end (``contains_key`` steps it).

    The pure map says cheaply whether it is rehashing. The C map gets
    ``len(m) // 4 + 1024`` probes instead: every keyed operation moves whole
    buckets until at least 4 entries moved or the rehash ends (invariant 9 of
    both maps), and at most ``len(m)`` entries remain to move, so that is
    enough.
    """
    contains = m.contains_key
    if is_rehashing(m) is None:
        for _ in range(len(m) // 4 + 1024):
            contains(-1, probe_namespace)
        return
    while is_rehashing(m):
        for _ in range(1024):
            contains(-1, probe_namespace)


def table_factory(impl: str) -> Callable[..., CopyOnWriteStateTable[Any, Any, Any]]:
    """A ``CopyOnWriteStateTable`` class whose maps are ``impl``'s
    ("c" or "python"); raises LookupError if that map is not built."""
    cls = map_class(impl)
    if cls is None:
        raise LookupError(f"the {impl} map is not built: {C_MAP_ERROR}")
    name = f"CopyOnWriteStateTable_{impl}"
    # ``map_class`` is the table's map constructor (``_create_map`` calls it)
    table: type[CopyOnWriteStateTable[Any, Any, Any]] = type(
        name,
        (CopyOnWriteStateTable,),
        {"map_class": cls, "__qualname__": name, "__module__": __name__},
    )
    return table
