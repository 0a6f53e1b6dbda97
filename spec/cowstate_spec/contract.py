"""What a caller does with the states it gets: the named helpers the state
machine and the differential runner share, and how both read a snapshot.

Free of Hypothesis, so Spark executors need only the library and the model.
Every helper is a module-level function so a failing step list prints as
replayable Python.
"""

from __future__ import annotations

from typing import Any


def snapshot_contents(entries: Any) -> dict[tuple[Any, Any], Any]:
    """A snapshot's (or map's) entries as a dict; a mapping seen twice is an error."""
    listed = [((key, namespace), state) for key, namespace, state in entries]
    contents = dict(listed)
    if len(contents) != len(listed):
        seen: set[tuple[Any, Any]] = set()
        twice = next(k for k, _ in listed if k in seen or seen.add(k))  # type: ignore[func-returns-value]
        raise AssertionError(f"{twice!r} yielded twice")
    return contents


def mutate_in_place(state: Any, item: int) -> bool:
    """Mutate a mutable state the way a caller would; False if it is immutable."""
    if isinstance(state, list):
        state.append(item)
        return True
    if isinstance(state, dict):
        state[f"m{item}"] = item
        return True
    return False


def add_or_append(old: Any, value: int) -> Any:
    """A transform function: create, add to, or mutate-in-place-and-return the state."""
    if old is None:
        return [value]
    if isinstance(old, bool) or not isinstance(old, int | list | dict):
        return (old, value)
    if isinstance(old, int):
        return old + value
    mutate_in_place(old, value)
    return old


def replace_with_value(old: Any, value: int) -> Any:
    """A transform function that ignores the old state."""
    return value


def raise_error(old: Any, value: int) -> Any:
    """A transform function that fails: the map must stay unchanged."""
    raise ValueError(f"transform refuses {value}")


def return_none(old: Any, value: int) -> Any:
    """A transform function that returns None: the map must stay unchanged."""
    return None


TRANSFORMS = {f.__name__: f for f in (add_or_append, replace_with_value, raise_error, return_none)}
