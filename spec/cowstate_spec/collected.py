"""States the map machines watch die: a leaked reference fails a step.

A map holds strong references to its states; one it never drops (a C map's
``put`` that forgets to release the state it replaced) changes no result a
model can compare -- only the state's lifetime. So the map state machines
hand the implementation its list and dict states as :class:`TrackedList` and
:class:`TrackedDict` (weak-referenceable copies, equal to the list or dict
they copy; the default serializer's deep copy keeps the type, so rule S's
copies are tracked too) and a :class:`Lifetimes` watches them:

- every state object the implementation is given or maps after a step is
  recorded by a weak reference;
- after a step with no snapshot open, every recorded state the live map no
  longer maps must have no reference left but those the harness holds on
  purpose (``held_elsewhere``: the C map checker's entry views, which
  outlive their entries). Nothing else may hold one: the model keeps its own
  deep copies, the machine drops what an operation returned when the rule
  ends, and every map drops a state no open snapshot can reach once it was
  replaced or removed -- the pure map at once, the C map when the last
  snapshot that could reach its retired entry is released (its header:
  "retirement by version"), at the latest when none is open.

References are counted (``sys.getrefcount``), not looked for: a leaked
reference of C code belongs to no object ``gc.get_referrers`` could name. A
reference cycle through an exception's traceback can hold a state until the
next collection, so a survivor is counted again after ``gc.collect()``
before the step fails. The check costs one iteration of the live map per
step.
"""

from __future__ import annotations

import gc
import sys
import weakref
from collections import Counter
from collections.abc import Callable, Iterable
from typing import Any

__all__ = ["Lifetimes", "TrackedDict", "TrackedList", "tracked"]


class TrackedList(list[Any]):
    """A list state a weak reference can watch."""

    __slots__ = ("__weakref__",)


class TrackedDict(dict[Any, Any]):
    """A dict state a weak reference can watch."""

    __slots__ = ("__weakref__",)


def tracked(state: Any) -> Any:
    """A tracked copy of a plain list or dict state; any other state as it is."""
    if type(state) is list:
        return TrackedList(state)
    if type(state) is dict:
        return TrackedDict(state)
    return state


class Lifetimes:
    """Weak references to the state objects an implementation held.

    ``held_elsewhere()`` counts, by ``id``, the references the harness itself
    keeps to states on purpose (default: none).
    """

    def __init__(self, held_elsewhere: Callable[[], Counter[int]] = Counter) -> None:
        self._held: dict[int, weakref.ref[Any]] = {}
        self._held_elsewhere = held_elsewhere

    def record(self, state: Any) -> None:
        """Watch ``state`` (a no-op for states without weak references: ints, strs)."""
        try:
            ref = weakref.ref(state)
        except TypeError:
            return
        self._held[id(state)] = ref

    def check(self, live: Iterable[Any], snapshots_open: bool) -> None:
        """Record the states the live map maps (``live``); with no snapshot open,
        require every other recorded state to be unreferenced, then forget it."""
        mapped = set()
        for state in live:
            self.record(state)
            mapped.add(id(state))
        if snapshots_open:
            return
        if self._leaked(mapped):
            gc.collect()  # a cycle through a traceback may hold one until then
        leaked = self._leaked(mapped)
        assert not leaked, (
            f"{len(leaked)} state(s) neither mapped nor held by an open snapshot still "
            f"have references (a leaked reference): {leaked[:3]}"
        )
        self._held = {key: ref for key, ref in self._held.items() if key in mapped}

    def _leaked(self, mapped: set[int]) -> list[str]:
        """The reprs of the recorded states outside ``mapped`` that still have a
        reference the harness does not account for (no list of the states
        themselves: it would be one)."""
        elsewhere = self._held_elsewhere()
        leaked = []
        for key, ref in self._held.items():
            if key in mapped:
                continue
            state = ref()
            # here: `state` and getrefcount's argument, plus the harness's own
            if state is not None and sys.getrefcount(state) > 2 + elsewhere[key]:
                leaked.append(f"{state!r} ({sys.getrefcount(state) - 2} references)")
            del state
        return leaked
