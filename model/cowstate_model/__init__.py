"""cowstate_model: the reference model, the meaning of every operation.

A state map *is* a dict ``{(key, namespace): state}``; a snapshot *is* an
immutable deep copy of that dict taken at that moment. Nothing here is
optimised: it must be obviously right.
"""

from cowstate_model.state_map import ReferenceSnapshot, ReferenceStateMap, StateEntry, deep_copy

__all__ = ["ReferenceSnapshot", "ReferenceStateMap", "StateEntry", "deep_copy"]
