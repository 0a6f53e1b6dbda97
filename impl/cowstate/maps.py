"""Which copy-on-write map ``cowstate.CopyOnWriteStateMap`` is.

Two implementations of one map, tested by one specification:

- ``"c"``: :mod:`cowstate._cmap`, the C extension (entries are C structs, a
  chunked bucket directory, snapshots in O(capacity / 1024); its design is
  the header comment of ``impl/cowstate/_cmap.c``). The default when built.
- ``"python"``: :mod:`cowstate.state_map`, the readable, Flink-faithful
  reference implementation and the fallback when the extension did not build.

``COWSTATE_PURE_PYTHON=1`` in the environment forces the pure map.
:data:`IMPLEMENTATION` says which one this process got, :data:`C_BUILD_ERROR`
why the C map is missing (``None`` when it imported).
"""

from __future__ import annotations

import os
from typing import TYPE_CHECKING, Any

from cowstate import state_map

__all__ = [
    "C_BUILD_ERROR",
    "FORCED_PURE",
    "IMPLEMENTATION",
    "CopyOnWriteStateMap",
    "StateMapSnapshot",
    "c_map_class",
]

#: True when ``COWSTATE_PURE_PYTHON`` is set to anything but "" or "0".
FORCED_PURE = os.environ.get("COWSTATE_PURE_PYTHON", "") not in ("", "0")

C_BUILD_ERROR: str | None
try:
    from cowstate import _cmap
except ImportError as exc:  # no compiler at install time: the pure map
    _cmap = None  # type: ignore[assignment]  # not built: the module name stays, bound to None
    C_BUILD_ERROR = f"{type(exc).__name__}: {exc}"
else:
    C_BUILD_ERROR = None

#: "c" or "python": the class behind ``cowstate.CopyOnWriteStateMap``.
IMPLEMENTATION = "c" if _cmap is not None and not FORCED_PURE else "python"


def c_map_class() -> type[_cmap.CopyOnWriteStateMap[Any, Any, Any]] | None:
    """The C map's class whether or not it is the default, or None if not built."""
    return None if _cmap is None else _cmap.CopyOnWriteStateMap


if TYPE_CHECKING:
    from cowstate.state_map import CopyOnWriteStateMap, StateMapSnapshot
elif IMPLEMENTATION == "c":
    CopyOnWriteStateMap = _cmap.CopyOnWriteStateMap
    StateMapSnapshot = _cmap.StateMapSnapshot
else:
    CopyOnWriteStateMap = state_map.CopyOnWriteStateMap
    StateMapSnapshot = state_map.StateMapSnapshot
