"""cowstate: Flink's copy-on-write keyed state map, in Python.

>>> from cowstate import CopyOnWriteStateMap
>>> m = CopyOnWriteStateMap()
>>> m.put("alice", "window-1", [1])
>>> with m.snapshot() as snap:
...     m.get("alice", "window-1").append(2)   # copy-on-write: snap keeps [1]
...     [tuple(e) for e in snap]
[('alice', 'window-1', [1])]
>>> m.get("alice", "window-1")
[1, 2]
"""

from cowstate.errors import (
    ConcurrentModificationError,
    CowStateError,
    ForeignSnapshotError,
    InvalidArgumentError,
    MaximumCapacityError,
    NoneStateError,
    SnapshotReleasedError,
    TransformFunctionError,
    UnhashableKeyError,
    VersionOverflowError,
)
from cowstate.serializers import DefaultSerializer, ImmutableSerializer, StateSerializer
from cowstate.state_map import CopyOnWriteStateMap, StateEntry, StateMapSnapshot

__version__ = "0.1.0"

__all__ = [
    "ConcurrentModificationError",
    "CopyOnWriteStateMap",
    "CowStateError",
    "DefaultSerializer",
    "ForeignSnapshotError",
    "ImmutableSerializer",
    "InvalidArgumentError",
    "MaximumCapacityError",
    "NoneStateError",
    "SnapshotReleasedError",
    "StateEntry",
    "StateMapSnapshot",
    "StateSerializer",
    "TransformFunctionError",
    "UnhashableKeyError",
    "VersionOverflowError",
]
