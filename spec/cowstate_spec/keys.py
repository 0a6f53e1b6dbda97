"""Keys with chosen hashes: they make long chains and collisions common.

Like ``immutables``' ``HashKey``: equality is by ``value``, the hash is
whatever the test chose, so different keys can share a bucket or even the
whole hash. The repr is valid Python, so a failing step list replays as is.

The chosen number is the *composite* hash the key gets with a namespace
whose ``hash`` is 0 (such as ``0``): ``__hash__`` returns the preimage of
``hash_value`` under the map's multiplier (:func:`cowstate.arithmetic.
composite_hash`), so ``HashKey(v, 5)`` with namespace 0 lands in bucket
``5 & (n - 1)`` of every table, as the seed's pictures draw it. With a
namespace of hash ``d`` the composite hash is ``hash_value + d``.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Iterable
from dataclasses import dataclass
from typing import Any

from cowstate_model.arithmetic import HASH_MIX

_MOD = 1 << 64
_MIX_INVERSE = pow(HASH_MIX, -1, _MOD)


def hash_for_composite(h: int) -> int:
    """The Python hash a key needs so that its composite hash with a namespace
    of hash 0 is ``spread_hash(h)`` (which is ``h`` for ``0 <= h < 2**16``)."""
    pre = (h * _MIX_INVERSE) % _MOD
    if pre >= _MOD // 2:  # as a signed 64-bit Py_hash_t
        pre -= _MOD
    assert pre != -1, f"no key can hash to -1 (Python turns it into -2): pick another than {h}"
    return pre


@dataclass(frozen=True, eq=False)
class HashKey:
    """A key equal to another ``HashKey`` with the same value, hashing to ``hash_value``."""

    value: object
    hash_value: int

    def __hash__(self) -> int:
        return hash_for_composite(self.hash_value)

    def __eq__(self, other: object) -> bool:
        return isinstance(other, HashKey) and self.value == other.value

    def __repr__(self) -> str:
        return f"HashKey({self.value!r}, {self.hash_value!r})"


def value_key(value: int) -> HashKey:
    """A key whose hash is its value (the seed's pictures use such keys)."""
    return HashKey(value, value)


#: Keys Python calls equal (with equal hashes) that are different Flink keys:
#: ``Integer``, ``Double``, ``Boolean``; ``-0.0`` is refused as a key by tables
#: and backends (``cowstate.key_types``), a plain key of the bare map.
EQUAL_KEYS: tuple[Any, ...] = (1, 1.0, True, 0, 0.0, -0.0, False)


def typed_keys(entries: Iterable[Any]) -> Counter[tuple[type, Any, type, Any]]:
    """The ``(key, namespace, state)`` entries' keys and namespaces with their
    types: ``1`` and ``True`` compare equal, ``(int, 1)`` and ``(bool, True)`` do
    not, so two sides holding equal keys of different types differ here."""
    return Counter((type(k), k, type(n), n) for k, n, _ in entries)
