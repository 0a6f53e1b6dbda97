"""Type stub of impl/cowstate/_keygroups.c (key groups of many keys in C)."""

from collections.abc import Sequence
from typing import Any

def key_group(key: Any, max_parallelism: int, long_keys: bool, /) -> int: ...
def key_groups(keys: Sequence[Any], max_parallelism: int, long_keys: bool, /) -> list[int]: ...
def first_not_in(
    keys: Sequence[Any], key_group: int, max_parallelism: int, long_keys: bool, start: int, /
) -> int: ...
