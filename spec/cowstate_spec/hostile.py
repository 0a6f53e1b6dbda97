"""Hostile user code: keys, states and functions that raise where a map calls them.

A map calls code of its caller's (rule U of :mod:`cowstate.state_map`): a key's
or namespace's ``__hash__`` and ``__eq__``, the serializer's ``copy`` (for the
default serializer a state's ``__deepcopy__``), a transform function. The state
machines draw the objects below to make that code raise, and require the
documented :mod:`cowstate.errors` exception with the map unchanged.

Each object raises only where a rule wants it to, so the rest of the run can
go on using what it stored:

- :class:`TrapKey` is a *probe*: a key (or namespace) the rule builds for one
  call and never stores. It hashes as the mapped key it targets, so the map
  must compare it with that key (a ``HashKey`` subclass, so Python asks its
  reflected ``__eq__`` first, even against a ``HashKey``), and raises
  :class:`Trapped` from ``__eq__`` (``trap="eq"``) or from ``__hash__``
  (``trap="hash"``).
- :class:`ReentrantKey` is a probe too, hashing as a mapped key, whose first
  ``__eq__`` runs a callback that changes the map being searched (rule R of
  :mod:`cowstate.state_map`: the search must start over); afterwards it is
  equal to itself only.
- :class:`CopyTrapList` is a list state that copies like a list, except
  while :func:`armed` is active: then its ``__deepcopy__`` raises.
- :func:`deep_state` builds a list nested deeper than a deep copy can go.
- :class:`MutateThenRaise` is a transform function that changes its argument
  in place, then raises; it remembers the object it was given.
- :class:`RaisingHash` raises ``ValueError("no hash today")`` from every
  ``__hash__``: for the tests of the message a raising hash gives, word for
  word (never drawn by a machine: nothing could store it).

Every repr is valid Python, so a failing step list replays as is.
"""

from __future__ import annotations

import copy
import sys
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import Any

from cowstate_spec.contract import mutate_in_place
from cowstate_spec.keys import HashKey

__all__ = [
    "CopyTrapList",
    "MutateThenRaise",
    "RaisingHash",
    "ReentrantKey",
    "TrapKey",
    "Trapped",
    "armed",
    "deep_state",
    "deep_state_depth",
]


class Trapped(Exception):
    """What hostile user code raises (never a TypeError: that one means unhashable)."""


@dataclass(frozen=True, eq=False)
class TrapKey(HashKey):
    """A probe key hashing as ``py_hash`` whose ``__eq__`` (``trap="eq"``) or
    ``__hash__`` (``trap="hash"``) raises :class:`Trapped`."""

    py_hash: int = 0
    trap: str = "eq"

    def __hash__(self) -> int:
        if self.trap == "hash":
            raise Trapped(f"__hash__ of {self!r}")
        return self.py_hash

    def __eq__(self, other: object) -> bool:
        if self.trap == "eq":
            raise Trapped(f"__eq__ of {self!r}")
        return other is self

    def __repr__(self) -> str:
        return f"TrapKey({self.value!r}, {self.hash_value!r}, {self.py_hash!r}, {self.trap!r})"


@dataclass(frozen=True, eq=False)
class ReentrantKey(HashKey):
    """A probe key hashing as ``py_hash`` whose first ``__eq__`` calls
    ``reenter()`` (which puts into the map that compares it), then compares
    by identity, as every later ``__eq__`` does. ``fired`` says whether it ran."""

    py_hash: int = 0
    reenter: Callable[[], object] = field(default=lambda: None, repr=False)
    _fired: list[bool] = field(default_factory=lambda: [False], repr=False)

    @property
    def fired(self) -> bool:
        return self._fired[0]

    def __hash__(self) -> int:
        return self.py_hash

    def __eq__(self, other: object) -> bool:
        if not self._fired[0]:
            self._fired[0] = True
            self.reenter()
        return other is self

    def __repr__(self) -> str:
        return f"ReentrantKey({self.value!r}, {self.hash_value!r}, {self.py_hash!r})"


_ARMED = [False]


@contextmanager
def armed() -> Iterator[None]:
    """While active, copying a :class:`CopyTrapList` raises :class:`Trapped`."""
    _ARMED[0] = True
    try:
        yield
    finally:
        _ARMED[0] = False


class CopyTrapList(list[Any]):
    """A list state whose deep copy raises while :func:`armed` is active."""

    def __deepcopy__(self, memo: dict[int, Any]) -> CopyTrapList:
        if _ARMED[0]:
            raise Trapped("__deepcopy__ of a CopyTrapList")
        return CopyTrapList(copy.deepcopy(list(self), memo))

    def __repr__(self) -> str:
        return f"CopyTrapList({list(self)!r})"


def deep_state_depth() -> int:
    """A nesting depth no deep copy reaches: more levels than the recursion
    limit allows frames (``copy.deepcopy`` takes two frames per list level;
    Hypothesis raises the limit while it runs a test, so it is read now)."""
    return sys.getrecursionlimit() + 100


def deep_state(depth: int | None = None) -> list[Any]:
    """``[[[...[0]...]]]``, ``depth`` lists deep (default: :func:`deep_state_depth`)."""
    state: list[Any] = [0]
    for _ in range((depth or deep_state_depth()) - 1):
        state = [state]
    return state


class MutateThenRaise:
    """A transform function that mutates the state it is given as a caller
    would (:func:`~cowstate_spec.contract.mutate_in_place`), then raises
    :class:`Trapped`. ``received`` is the object it was given (``None``: an
    absent mapping, or not called yet)."""

    __name__ = "mutate_then_raise"

    def __init__(self) -> None:
        self.received: Any = None
        self.called = False

    def __call__(self, old: Any, value: int) -> Any:
        self.called = True
        self.received = old
        mutate_in_place(old, value)
        raise Trapped(f"{self.__name__} after mutating its argument")

    def __repr__(self) -> str:
        return "MutateThenRaise()"


class RaisingHash:
    """A key or namespace whose ``hash()`` always raises ``ValueError`` (rule U:
    :class:`~cowstate.errors.KeyHashError`)."""

    def __hash__(self) -> int:
        raise ValueError("no hash today")

    def __repr__(self) -> str:
        return "RaisingHash()"
