"""cowstate_model: the reference model, the meaning of every operation.

A state map *is* a dict ``{(key, namespace): state}``; a snapshot *is* an
immutable deep copy of that dict taken at that moment. A state table is such a
dict restricted to the keys of its key groups; a keyed state backend is one
such dict per state name. Nothing here is optimised: it must be obviously right.
"""

from cowstate_model.backend import ReferenceBackendSnapshot, ReferenceKeyedStateBackend
from cowstate_model.state_map import ReferenceSnapshot, ReferenceStateMap, StateEntry, deep_copy
from cowstate_model.state_table import ReferenceStateTable, ReferenceTableSnapshot

__all__ = [
    "ReferenceBackendSnapshot",
    "ReferenceKeyedStateBackend",
    "ReferenceSnapshot",
    "ReferenceStateMap",
    "ReferenceStateTable",
    "ReferenceTableSnapshot",
    "StateEntry",
    "deep_copy",
]
