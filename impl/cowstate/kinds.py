"""The state kinds in one table: the registry every other module reads.

============  ==========================  ==================  ============
kind          descriptor                  handle              holds (E5)
============  ==========================  ==================  ============
value         ValueStateDescriptor        ValueState          any value
list          ListStateDescriptor         ListState           ``list``
map           MapStateDescriptor          MapState            ``dict``
reducing      ReducingStateDescriptor     ReducingState       any value
aggregating   AggregatingStateDescriptor  AggregatingState    any value
============  ==========================  ==================  ============

The columns (:class:`Kind`; the descriptor and handle classes, and the kinds'
names, are in :mod:`cowstate.descriptors`):

- *kind*: the name, a :class:`~cowstate.descriptors.StateKind` member (the
  descriptor's ``kind`` is its value). The key of :data:`KINDS`; snapshot
  files, checkpoint handles and messages record it, and
  :class:`~cowstate.state_meta.StateMetaInfo` and
  :class:`~cowstate.state_meta.StateMetadata` accept no other.
- *descriptor*: what a user registers a state of the kind with;
  ``get_state`` refuses a descriptor whose kind has no row here.
- *handle*: what ``get_state`` gives for the descriptor (the descriptor
  class's ``handle``, which also types ``get_state``): the kind's
  operations on the table of its state.
- *holds*: the type every state of the kind has, which every restore checks
  (E5 of :mod:`cowstate.snapshot.checks`: ints restored into a list state are
  refused by the restore, not by the first ``add``); ``None``: any value.

Serializers are not per kind: every descriptor defaults to the
:class:`~cowstate.serializers.DefaultSerializer`, and a restored state's
serializer is found by its identifier alone.

Readers: :mod:`cowstate.keyed_backend` (``get_state``: which descriptors
name a kind, which handle) and :mod:`cowstate.snapshot.checks` (E5). The
names alone, ``StateKind``, are what :mod:`cowstate.state_meta` validates
kinds against, and :mod:`cowstate` re-exports ``descriptors.__all__`` (every
kind's two classes). Nothing else in ``impl`` names a kind. The reference model
(``cowstate_model.kinds.KINDS``: the model's handles) and the spec
(``cowstate_spec.kinds.KINDS``: the state the machines register, their rules)
keep one table each by the same names; ``tests/test_state_kinds.py`` requires
the three to name the same kinds, and says which file lacks one.

Adding a kind is four files (CONTRIBUTING, "Adding a state kind"):

1. ``impl/cowstate/descriptors.py``: its ``StateKind`` member, its handle
   class, its descriptor class (``kind``, ``handle``), both in ``__all__``;
2. ``impl/cowstate/kinds.py``: its row in :data:`KINDS` below;
3. ``model/cowstate_model/kinds.py``: the model's handle, and its row;
4. ``spec/cowstate_spec/kinds.py``: the state the machines register and the
   backend machine's rules for it, and its row.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from types import MappingProxyType

from cowstate.descriptors import (
    AggregatingStateDescriptor,
    ListStateDescriptor,
    MapStateDescriptor,
    ReducingStateDescriptor,
    StateDescriptor,
    StateKind,
    ValueStateDescriptor,
)
from cowstate.keyed_state import KeyedState

__all__ = ["KINDS", "Kind"]


@dataclass(frozen=True)
class Kind:
    """One row of the table: a kind's descriptor class, and what its states hold."""

    descriptor: type[StateDescriptor]
    #: E5: the type of every state of the kind (``None``: any value).
    holds: type | None = None

    @property
    def kind(self) -> StateKind:
        return StateKind(self.descriptor.kind)

    @property
    def handle(self) -> type[KeyedState]:
        return self.descriptor.handle


#: Every state kind by its name, in :class:`~cowstate.descriptors.StateKind` order.
KINDS: Mapping[str, Kind] = MappingProxyType(
    {
        row.kind: row
        for row in (
            Kind(ValueStateDescriptor),
            Kind(ListStateDescriptor, holds=list),
            Kind(MapStateDescriptor, holds=dict),
            Kind(ReducingStateDescriptor),
            Kind(AggregatingStateDescriptor),
        )
    }
)
