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

from cowstate_spec.contract import TRANSFORMS
from cowstate_spec.keys import HashKey

#: Keys: small ints (long chains in tiny tables), colliding HashKeys (hashes 0, 4
#: and 64 share low buckets, 7 and 15 the last ones of 8 and 16 buckets, so a
#: rehash step can stop late in the table), short strings, and equal keys of
#: different types (``1.0``, ``True``, ``0.0``, ``-0.0`` beside the ints: one
#: mapping in a map, as in a dict; refused by a table holding a number of
#: another type, and ``-0.0`` by every table: ``cowstate.key_types``).
keys: st.SearchStrategy[Any] = st.one_of(
    st.integers(min_value=0, max_value=9),
    st.builds(HashKey, st.integers(min_value=0, max_value=3), st.sampled_from([0, 4, 64, 7, 15])),
    # The order is the one the coverage thresholds were measured with.
    st.sampled_from(["a", 1.0, "b", -0.0, True, 0.0, False]),
)

#: The keys ``put_many`` puts a run of (cheap to draw: a start and a count):
#: ints, then HashKeys spread over the first and last buckets of 8 and 16.
MANY_KEYS: tuple[Any, ...] = (
    *range(10),
    *(HashKey(v, h) for h in (7, 0, 15, 4) for v in range(3)),
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


transform_functions = st.sampled_from(list(TRANSFORMS.values()))

#: Transform functions that return a state (for the rules that aim at rule S).
succeeding_transform_functions = st.sampled_from(
    [f for f in TRANSFORMS.values() if f.__name__ in ("add_or_append", "replace_with_value")]
)
