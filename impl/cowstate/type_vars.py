"""The type variables every layer is generic over, defined once.

- ``K``: a key, ``N``: a namespace (both hashable);
- ``S``: a state;
- ``V``: the value a ``transform`` combines with the old state.

A map, a table and their protocols (:mod:`cowstate.protocols`) of
``K, N, S`` use these very variables, so a reader (and mypy) follows one key
type from the backend down to the map.
"""

from __future__ import annotations

from collections.abc import Hashable
from typing import TypeVar

__all__ = ["K", "N", "S", "V"]

K = TypeVar("K", bound=Hashable)
N = TypeVar("N", bound=Hashable)
S = TypeVar("S")
V = TypeVar("V")
