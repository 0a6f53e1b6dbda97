"""The process protocol: what both sides of ``docs/protocol.md`` share.

``docs/protocol.md`` is the protocol's one page (for someone writing an
adapter in another language); this module holds the same facts as data for
the two Python sides: the runner (:mod:`cowstate_spec.process_impl`) and the
Python adapter loop (:mod:`cowstate_spec.adapters.serve`).

Wire values (rule W of the page):

- a key or namespace is a JSON integer or string, or ``{"HashKey": [value,
  hash]}`` for :class:`~cowstate_spec.keys.HashKey` (a key whose hash code
  is ``hash``, equal to another exactly when the values are equal);
- a state is an integer, a string, an array (a mutable list), an object (a
  mutable map with string keys), or ``{"tuple": [...]}`` (an immutable
  sequence; only results hold one: ``add_or_append`` makes it of a string).

Free of Hypothesis and Spark: an executor and a child process import it.
"""

from __future__ import annotations

from typing import Any

from cowstate_spec.keys import HashKey
from cowstate_spec.spark_env import CheckEnvironmentError

__all__ = [
    "CAPABILITY_DEFAULTS",
    "MUTATION_ITEM",
    "OPERATIONS",
    "VERSION",
    "ProtocolError",
    "key_from_wire",
    "key_to_wire",
    "state_from_wire",
    "state_to_wire",
]

#: The protocol version this side speaks (the hello negotiates it).
VERSION = 1
#: The item a caller mutates an old state with (``put_and_get_old``,
#: ``remove_and_get_old``), as the in-process runner does.
MUTATION_ITEM = 7

#: Every operation of version 1, with its arguments after the name.
OPERATIONS: dict[str, str] = {
    "create": "initial_capacity",
    "put": "key namespace state",
    "get": "key namespace",
    "get_and_mutate": "key namespace item",
    "contains_key": "key namespace",
    "put_and_get_old": "key namespace state item",
    "remove": "key namespace",
    "remove_and_get_old": "key namespace item",
    "transform": "key namespace value function",
    "snapshot": "id",
    "release": "id",
    "snapshots": "",
    "iterate": "",
    "keys": "namespace",
    "interrupt_iteration": "taken operation",
    "check": "",
}

#: What the hello's ``capabilities`` mean when one is left out.
CAPABILITY_DEFAULTS: dict[str, bool] = {
    "snapshots": True,
    "put_reports_insert": True,
    "mutations_persist": True,
    "fail_fast": True,
    "state_handles": True,
    "rehash_visible": False,
    "check": False,
}


class ProtocolError(CheckEnvironmentError):
    """An implementation process that cannot be checked: it did not start,
    died, answered something that is no protocol line, or speaks another
    version. The message names the implementation; it is one line."""


def key_to_wire(key: Any) -> Any:
    """A key or namespace as JSON (rule W)."""
    if type(key) is HashKey:
        return {"HashKey": [key.value, key.hash_value]}
    return key


def key_from_wire(value: Any) -> Any:
    """The key :func:`key_to_wire` wrote."""
    if type(value) is dict:
        inner, h = value["HashKey"]
        return HashKey(inner, h)
    return value


def state_to_wire(state: Any) -> Any:
    """A state as JSON: tuples (at any depth of a tuple) become ``{"tuple": [...]}``."""
    if type(state) is tuple:
        return {"tuple": [state_to_wire(item) for item in state]}
    return state


def state_from_wire(value: Any) -> Any:
    """The state :func:`state_to_wire` wrote."""
    if type(value) is dict and len(value) == 1 and "tuple" in value:
        return tuple(state_from_wire(item) for item in value["tuple"])
    return value
