"""Key types, said plainly: one key type per table and backend.

``1``, ``1.0`` and ``True`` are equal in Python and three different keys in
Flink (``Integer``, ``Double``, ``Boolean``: other key groups, other bytes).
The meaning cowstate gives them: a table or backend takes the type of the
first key it stores (a backend: of its first current key), and refuses keys
of any other type; a tuple's type is the types of its fields. NaN (never equal
to itself) and ``-0.0`` (equal to ``0.0``, but not the same Flink key) are
never keys, also not inside a tuple. A table on its own holds one type per
*domain* instead: numbers (and tuples of the same shape over them) can be
equal across types, so they share one domain; any other type is its own.
"""

from __future__ import annotations

import math
import numbers
from typing import Any

__all__ = ["key_domain", "key_type"]


def key_type(key: Any) -> Any:
    """The type of ``key``: ``type(key)``, or a tuple's field types; ``ValueError``
    for NaN and -0.0 anywhere in it."""
    if type(key) is tuple:
        return ("tuple", tuple(key_type(field) for field in key))
    if type(key) is float and (math.isnan(key) or (key == 0.0 and math.copysign(1.0, key) < 0)):
        raise ValueError(f"{key!r} cannot be a key")
    return type(key)


def key_domain(key: Any) -> Any:
    """The keys ``key`` could be equal to across types: ``"number"`` for numbers,
    a tuple's field domains, else ``type(key)``."""
    if type(key) is tuple:
        return ("tuple", tuple(key_domain(field) for field in key))
    return "number" if isinstance(key, numbers.Number) else type(key)
