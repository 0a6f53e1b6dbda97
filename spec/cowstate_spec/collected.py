"""States the map checks watch die: a leaked reference fails a check.

A map holds strong references to its states; one it never drops (a C map's
``put`` that forgets to release the state it replaced) changes no result a
model can compare -- only the state's lifetime. So a :class:`Lifetimes`
watches the states an implementation is given and maps:

- every state object the implementation is given (:meth:`Lifetimes.track`
  makes the copy it is given) or maps at a check is recorded, with where it
  came from (``origin``, which the owner's ``describe`` turns into words for
  the message: the differential runner names the operation and step that
  gave it and the one that replaced or removed its mapping);
- at a check with no snapshot open, every recorded state the live map no
  longer maps must have no reference left but the watcher's own and those
  the harness holds on purpose (``held_elsewhere``: the C map checker's
  entry views, which outlive their entries). Nothing else may hold one: the
  model keeps its own deep copies, the harness drops what an operation
  returned when the step ends, and every map drops a state no open snapshot
  can reach once it was replaced or removed -- the pure map at once, the C
  map when the last snapshot that could reach its retired entry is released
  (its header: "retirement by version"), at the latest when none is open.

Two ways to record, one check:

- **By weak reference** (the map state machines, :mod:`cowstate_spec.
  machine`, after every step): the implementation is given its list and
  dict states as :class:`TrackedList` and :class:`TrackedDict`
  (weak-referenceable copies, equal to the list or dict they copy; the
  default serializer's deep copy keeps the type, so rule S's copies are
  tracked too). Watching changes no lifetime: a state freed too early is
  still freed (and ``make sanitize`` sees the use after it).
- **By holding** (``hold=True``: the differential runner,
  :mod:`cowstate_spec.differential`, at its ``check_every`` cadence and at
  the end of every workload): plain lists and dicts, held by the watcher
  until the check that finds them unmapped. Any list or dict can be
  watched, so the implementation sees the states it sees in use (a
  subclass would take the serializers' slow copy path: the runner's checked
  operations per CPU second fell by 10-18 % with tracked copies, by about
  5 % holding), at the price of keeping a replaced state alive until that
  check (a reference a map drops once too often is then hidden until the
  watcher lets go; the machines, run under ``make sanitize``, see that).

References are counted (``sys.getrefcount``), not looked for: a leaked
reference of C code belongs to no object ``gc.get_referrers`` could name. A
reference cycle through an exception's traceback can hold a state until the
next collection, so a survivor is counted again after ``gc.collect()``
before the check fails. A check costs one iteration of the live map.

The failure message starts with ``a leaked reference:`` and names up to
three survivors, each with its origin and its references beyond the
watcher's and the harness's.
"""

from __future__ import annotations

import gc
import sys
import weakref
from collections import Counter
from collections.abc import Callable, Iterable
from typing import Any

from cowstate_model import deep_copy

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


#: What holding watches: objects of these types are never shared by the
#: interpreter (an int or a str may be cached or interned).
_HELD_TYPES = frozenset({list, dict})


class Lifetimes:
    """The state objects an implementation held, by weak reference or held
    (``hold``; the module doc).

    ``held_elsewhere()`` counts, by ``id``, the references the harness itself
    keeps to states on purpose (default: none); ``describe(origin)`` says in
    words where a state recorded with ``origin`` came from (default: no
    words).
    """

    def __init__(
        self,
        held_elsewhere: Callable[[], Counter[int]] = Counter,
        describe: Callable[[Any], str] | None = None,
        *,
        hold: bool = False,
    ) -> None:
        # id -> the state (hold) or a weak reference to it
        self._held: dict[int, Any] = {}
        self._origins: dict[int, Any] = {}
        self._held_elsewhere = held_elsewhere
        self._describe = describe
        self._hold = hold

    def track(self, state: Any, origin: Any = None) -> Any:
        """The deep copy of ``state`` to give the implementation, recorded with
        ``origin`` (weak references: a tracked copy, :func:`tracked`)."""
        copied = deep_copy(state)
        if not self._hold:
            copied = tracked(copied)
            self.record(copied, origin)
        elif type(copied) in _HELD_TYPES:  # record's, inline: once per put
            key = id(copied)
            self._held[key] = copied
            self._origins[key] = origin
        return copied

    def record(self, state: Any, origin: Any = None) -> None:
        """Watch ``state`` (a no-op for states it cannot watch: ints, strs; and
        when holding, anything but a list or a dict)."""
        key = id(state)
        if self._hold:
            if type(state) not in _HELD_TYPES:
                return
            self._held[key] = state
        else:
            try:
                self._held[key] = weakref.ref(state)
            except TypeError:
                return
        if origin is None:
            self._origins.pop(key, None)
        else:
            self._origins[key] = origin

    def check(self, live: Iterable[Any], snapshots_open: bool, origin: Any = None) -> None:
        """Record the states the live map maps (``live``; those not yet recorded
        with ``origin``); with no snapshot open, require every other recorded
        state to be unreferenced, then forget it."""
        held, hold = self._held, self._hold
        mapped = set()
        for state in live:
            key = id(state)
            mapped.add(key)
            known = held.get(key)
            if known is None or (known if hold else known()) is not state:
                self.record(state, origin)
        if snapshots_open:
            return
        if self._leaked(mapped):
            gc.collect()  # a cycle through a traceback may hold one until then
        leaked = self._leaked(mapped)
        assert not leaked, f"a leaked reference: {'; '.join(leaked[:3])}" + (
            f"; and {len(leaked) - 3} more" if len(leaked) > 3 else ""
        )
        self._held = {key: held for key, held in self._held.items() if key in mapped}
        self._origins = {key: o for key, o in self._origins.items() if key in mapped}

    def _leaked(self, mapped: set[int]) -> list[str]:
        """What the recorded states outside ``mapped`` that still have a
        reference the harness does not account for are (no list of the states
        themselves: it would be one)."""
        held, hold = self._held, self._hold
        # here: `state` and getrefcount's argument, and holding: the watcher's own
        own = 3 if hold else 2
        elsewhere: Counter[int] | None = None
        leaked = []
        for key in [key for key in held if key not in mapped]:
            state = held[key] if hold else held[key]()
            if state is None:
                continue
            extra = sys.getrefcount(state) - own
            if extra > 0:
                if elsewhere is None:
                    elsewhere = self._held_elsewhere()
                extra -= elsewhere[key]
            if extra > 0:
                leaked.append(self._say(key, state, extra))
            del state
        return leaked

    def _say(self, key: int, state: Any, extra: int) -> str:
        origin = self._origins.get(key)
        where = (
            f", {self._describe(origin)},"
            if self._describe is not None and origin is not None
            else ""
        )
        return (
            f"state {state!r}{where} is still alive with {extra} "
            f"reference{'' if extra == 1 else 's'} though the map maps it no more "
            "and no snapshot is open"
        )
