"""Keys with chosen hashes: they make long chains and collisions common.

Like ``immutables``' ``HashKey``: equality is by ``value``, the hash is
whatever the test chose, so different keys can share a bucket or even the
whole hash. The repr is valid Python, so a failing step list replays as is.
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True, eq=False)
class HashKey:
    """A key equal to another ``HashKey`` with the same value, hashing to ``hash_value``."""

    value: object
    hash_value: int

    def __hash__(self) -> int:
        return self.hash_value

    def __eq__(self, other: object) -> bool:
        return isinstance(other, HashKey) and self.value == other.value

    def __repr__(self) -> str:
        return f"HashKey({self.value!r}, {self.hash_value!r})"


def value_key(value: int) -> HashKey:
    """A key whose hash is its value (the seed's pictures use such keys)."""
    return HashKey(value, value)
