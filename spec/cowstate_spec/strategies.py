"""Hypothesis strategies and the named helpers the state machine uses.

The domains are small on purpose: few keys make long chains and repeated
updates, ``HashKey``s with shared hashes make same-bucket and same-hash
collisions, and a mix of immutable and mutable states exercises both halves
of rule S. Every helper is a module-level function so a failing step list
prints as replayable Python.
"""

from __future__ import annotations

from typing import Any

from hypothesis import strategies as st

from cowstate_spec.keys import HashKey

#: Keys: small ints (long chains in tiny tables), colliding HashKeys, short strings.
keys: st.SearchStrategy[Any] = st.one_of(
    st.integers(min_value=0, max_value=9),
    st.builds(HashKey, st.integers(min_value=0, max_value=3), st.sampled_from([0, 4, 64])),
    st.sampled_from(["a", "b"]),
)

namespaces: st.SearchStrategy[Any] = st.sampled_from([0, 1, "ns", HashKey("n", 0)])

#: A fresh composite key.
composite_keys: st.SearchStrategy[tuple[Any, Any]] = st.tuples(keys, namespaces)

_mutable_states = st.one_of(
    st.lists(st.integers(0, 9), max_size=3),
    st.dictionaries(st.sampled_from("pq"), st.integers(0, 9), max_size=2),
)
_immutable_states = st.one_of(
    st.integers(min_value=-3, max_value=50),
    st.text(alphabet="xyz", max_size=3),
    st.tuples(st.integers(0, 3)),
)

#: States: mutable (list, dict) two times in three, else immutable (int, str, tuple).
states: st.SearchStrategy[Any] = st.one_of(_mutable_states, _mutable_states, _immutable_states)

unhashables: st.SearchStrategy[Any] = st.sampled_from([[], {}, {1}, ["k"]])


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


transform_functions = st.sampled_from([add_or_append, replace_with_value, raise_error,
                                       return_none])
