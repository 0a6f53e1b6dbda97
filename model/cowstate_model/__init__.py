"""cowstate_model: the reference model, the meaning of every operation.

A state map *is* a dict ``{(key, namespace): state}``; a snapshot *is* an
immutable deep copy of that dict taken at that moment. A state table is such a
dict restricted to the keys of its key groups; a keyed state backend is one
such dict per state name. Nothing here is optimised: it must be obviously right.

- :mod:`cowstate_model.state_map`: ``ReferenceStateMap`` and its snapshots;
- :mod:`cowstate_model.state_table`: ``ReferenceStateTable``, the map restricted
  to its key groups;
- :mod:`cowstate_model.backend`: ``ReferenceKeyedStateBackend``, one dict per state;
- :mod:`cowstate_model.kinds`: what each kind of keyed state means (its handle);
- :mod:`cowstate_model.storage`: ``ReferenceStorage``, which snapshots exist and
  what each holds;
- :mod:`cowstate_model.arithmetic`, :mod:`cowstate_model.key_groups`: the map's
  and the key groups' arithmetic said the obvious way (the checkers' yardstick);
- :mod:`cowstate_model.value_codec`: the default serializer's bytes written by
  hand, byte by byte (the key-group hash of keys without a Java hash).
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
