"""The errors of ``cowstate.errors`` as they are built and as the maps raise
them (rule U: user code that raises), word for word.

- the constructors: ``KeyHashError.raised_by_pair`` names the key or the
  namespace (whichever hash raised), ``KeyComparisonError.of`` the pair,
  ``StateCopyError.of`` a ``RecursionError`` as ``StateTooDeepError``; the
  unknown-name errors read as their message, unquoted;
- the helpers: ``UnhashableKeyError.check`` names the role and the value (a
  raising ``__hash__`` is a ``KeyHashError``); a message shows at most 200
  characters of a repr and survives a raising one;
- rule U per operation: every keyed operation of both maps names the key or
  namespace whose hash raised, the pair whose comparison raised, and (the
  copying ones) the pair whose copy raised; the map is unchanged; the C map
  names a copy that changed the map it copies for.

The messages of misuse (released snapshots, iteration across a change) and
the other messages of the maps are in ``test_error_messages.py``; hostile
user code against the state machines in ``test_user_code_errors.py``. The
tests marked ``kills`` were written to kill mutants of the module (``make
mutate``); their comments name what they pin.
"""

from __future__ import annotations

from typing import Any

import pytest
from conftest import MAPS

from cowstate.errors import (
    ConcurrentModificationError,
    KeyComparisonError,
    KeyHashError,
    StateCopyError,
    StateTooDeepError,
    UnhashableKeyError,
    UnknownCheckpointError,
    UnknownStateError,
)
from cowstate.serializers import DefaultSerializer
from cowstate_spec.hostile import RaisingHash

# ------------------------------------------------------------ the constructors


@pytest.mark.kills(module="cowstate.errors")
def test_a_raising_key_hash_is_named_as_the_key() -> None:
    # errors.KeyHashError.raised_by_pair / raised_by: no map test hashed a
    # pair whose key raised with a message compared word for word.
    exc = ValueError("no hash today")
    error = KeyHashError.raised_by_pair(RaisingHash(), "ns", exc)
    assert type(error) is KeyHashError
    assert str(error) == (
        "expected hash() of the key RaisingHash() to return an int, got "
        "ValueError: no hash today; the map is unchanged"
    )


@pytest.mark.kills(module="cowstate.errors")
def test_a_raising_namespace_hash_is_named_as_the_namespace() -> None:
    # errors.KeyHashError.raised_by_pair: the key hashes, so the namespace raised.
    exc = ValueError("no hash today")
    error = KeyHashError.raised_by_pair("k", RaisingHash(), exc)
    assert str(error) == (
        "expected hash() of the namespace RaisingHash() to return an int, got "
        "ValueError: no hash today; the map is unchanged"
    )


@pytest.mark.kills(module="cowstate.errors")
def test_a_raising_key_comparison_names_the_pair_and_the_cause() -> None:
    # errors.KeyComparisonError.of: the message word for word.
    error = KeyComparisonError.of("k", 3, RuntimeError("eq broke"))
    assert type(error) is KeyComparisonError
    assert str(error) == (
        "expected comparing ('k', 3) with the mapped keys (__eq__) to return a bool, "
        "got RuntimeError: eq broke; the map is unchanged"
    )


@pytest.mark.kills(module="cowstate.errors")
def test_a_recursion_error_while_copying_is_a_state_too_deep_error() -> None:
    # errors.StateTooDeepError.of (through StateCopyError.of): type and message.
    error = StateCopyError.of("k", 3, RecursionError("maximum recursion depth exceeded"))
    assert type(error) is StateTooDeepError
    assert str(error) == (
        "expected a state the serializer can copy within Python's recursion limit for "
        "('k', 3), got one nested too deep (RecursionError: maximum recursion depth "
        "exceeded); the map is unchanged"
    )


@pytest.mark.kills(module="cowstate.errors")
@pytest.mark.parametrize("error_class", [UnknownStateError, UnknownCheckpointError])
def test_unknown_name_errors_read_as_their_message_unquoted(error_class: type[KeyError]) -> None:
    # errors.UnknownStateError.__str__ / UnknownCheckpointError.__str__: a
    # KeyError would quote the message; with no argument the text is empty.
    assert str(error_class("no state named 'x'")) == "no state named 'x'"
    assert str(error_class()) == ""


# ------------------------------------------ the checks and the message helpers


@pytest.mark.kills(module="cowstate.errors")
def test_unhashable_check_names_the_role_and_the_value() -> None:
    # errors.UnhashableKeyError.check: the message, the role, chained from the
    # TypeError hash raised (issue 26), and a raising __hash__ as KeyHashError.
    with pytest.raises(UnhashableKeyError) as caught:
        UnhashableKeyError.check([1, 2])
    assert type(caught.value) is UnhashableKeyError
    assert str(caught.value) == "expected a hashable key, got list [1, 2]"
    cause = caught.value.__cause__
    assert type(cause) is TypeError and str(cause) == "unhashable type: 'list'"
    assert caught.value.__suppress_context__
    with pytest.raises(UnhashableKeyError) as namespace:
        UnhashableKeyError.check({"a": 1}, "namespace")
    assert str(namespace.value) == "expected a hashable namespace, got dict {'a': 1}"
    with pytest.raises(KeyHashError) as raising:
        UnhashableKeyError.check(RaisingHash(), "namespace")
    assert str(raising.value) == (
        "expected hash() of the namespace RaisingHash() to return an int, got "
        "ValueError: no hash today; the map is unchanged"
    )
    assert isinstance(raising.value.__cause__, ValueError)
    UnhashableKeyError.check(("a", 1))  # hashable: nothing raised


class _RaisingRepr:
    def __repr__(self) -> str:
        raise RuntimeError("no repr")


@pytest.mark.kills(module="cowstate.errors")
def test_a_message_shortens_a_long_repr_and_survives_a_raising_one() -> None:
    # errors._describe: at most 200 characters (197 and "..."), and a repr
    # that raises is replaced by the type's name.
    long = "x" * 300
    error = KeyComparisonError.of(long, _RaisingRepr(), RuntimeError("eq"))
    shown = repr(long)[:197] + "..."
    assert str(error) == (
        f"expected comparing ({shown}, <_RaisingRepr object>) with the mapped keys "
        "(__eq__) to return a bool, got RuntimeError: eq; the map is unchanged"
    )
    exact = "y" * 198  # its repr is 200 characters: shown whole
    assert f"({exact!r}, 1)" in str(KeyComparisonError.of(exact, 1, RuntimeError("eq")))
    over = "y" * 199  # 201: shortened
    assert f"({repr(over)[:197]}..., 1)" in str(KeyComparisonError.of(over, 1, RuntimeError("eq")))


# ------------------------------------------------------- rule U, per operation
#
# state_map.{get,put,put_and_get_old,remove_and_get_old,transform,_find,
# _hash_and_step,_remove_entry,_copy_state_for_caller}: the killers drew hostile
# user code only in test_user_code_errors.py (make strength), so each call's
# (key, namespace) arguments to the error constructors went unchecked.

OPERATIONS: dict[str, Any] = {
    "get": lambda m, k, n: m.get(k, n),
    "contains_key": lambda m, k, n: m.contains_key(k, n),
    "put": lambda m, k, n: m.put(k, n, [7]),
    "put_and_get_old": lambda m, k, n: m.put_and_get_old(k, n, [7]),
    "remove": lambda m, k, n: m.remove(k, n),
    "remove_and_get_old": lambda m, k, n: m.remove_and_get_old(k, n),
    "transform": lambda m, k, n: m.transform(k, n, 1, lambda s, v: [v]),
}


COPYING = ["get", "put_and_get_old", "remove_and_get_old", "transform"]


class _RaisingEq:
    """Instances share one hash and their ``__eq__`` raises."""

    def __hash__(self) -> int:
        return 7

    def __eq__(self, other: object) -> bool:
        raise RuntimeError("eq broke")

    def __repr__(self) -> str:
        return "RaisingEq()"


class _RaisingCopy(DefaultSerializer):
    def __init__(self, exc: Exception) -> None:
        self.exc = exc

    def copy(self, state: Any) -> Any:
        raise self.exc


def _contents(m: Any) -> dict[tuple[Any, Any], Any]:
    return {(k, n): s for k, n, s in m}


# It absorbed test_the_map_reports_a_raising_key_hash_with_its_cause (put, the
# key: the message, the chained cause, the map unchanged).
@pytest.mark.kills(module="cowstate.state_map")
@pytest.mark.kills(module="cowstate.errors")
@pytest.mark.parametrize("operation", OPERATIONS)
def test_every_operation_names_the_key_or_namespace_whose_hash_raised(
    map_impl: str, operation: str
) -> None:
    m = MAPS[map_impl]()
    m.put("k", "ns", [1])
    for key, namespace, role in ((RaisingHash(), "ns", "key"), ("k", RaisingHash(), "namespace")):
        with pytest.raises(KeyHashError) as caught:
            OPERATIONS[operation](m, key, namespace)
        assert str(caught.value) == (
            f"expected hash() of the {role} RaisingHash() to return an int, got "
            "ValueError: no hash today; the map is unchanged"
        )
        assert isinstance(caught.value.__cause__, ValueError)
    assert _contents(m) == {("k", "ns"): [1]}


@pytest.mark.kills(module="cowstate.state_map")
@pytest.mark.parametrize("operation", OPERATIONS)
def test_every_operation_names_the_pair_whose_comparison_raised(
    map_impl: str, operation: str
) -> None:
    m = MAPS[map_impl]()
    mapped = _RaisingEq()
    m.put(mapped, "ns", [1])
    with pytest.raises(KeyComparisonError) as caught:
        OPERATIONS[operation](m, _RaisingEq(), "ns")
    assert str(caught.value) == (
        "expected comparing (RaisingEq(), 'ns') with the mapped keys (__eq__) to return "
        "a bool, got RuntimeError: eq broke; the map is unchanged"
    )
    assert [(k is mapped, n, s) for k, n, s in m] == [(True, "ns", [1])]


@pytest.mark.kills(module="cowstate.state_map")
@pytest.mark.parametrize("operation", COPYING)
def test_every_copying_operation_names_the_pair_whose_copy_raised(
    map_impl: str, operation: str
) -> None:
    m = MAPS[map_impl]()
    m.put("k", "ns", [1])
    snapshot = m.snapshot()
    m.serializer = _RaisingCopy(LookupError("no copy"))
    with pytest.raises(StateCopyError) as caught:
        OPERATIONS[operation](m, "k", "ns")
    assert type(caught.value) is StateCopyError
    assert str(caught.value) == (
        "expected the state serializer to copy the state of ('k', 'ns'), got "
        "LookupError: no copy; the map is unchanged"
    )
    m.serializer = _RaisingCopy(RecursionError("too deep"))
    with pytest.raises(StateTooDeepError) as deep:
        OPERATIONS[operation](m, "k", "ns")
    assert str(deep.value) == (
        "expected a state the serializer can copy within Python's recursion limit for "
        "('k', 'ns'), got one nested too deep (RecursionError: too deep); the map is unchanged"
    )
    assert _contents(m) == {("k", "ns"): [1]}
    m.release(snapshot)


@pytest.mark.kills(module="cowstate.map_contract")
def test_keys_of_a_namespace_whose_comparison_raises_names_the_key(map_impl: str) -> None:
    # map_contract.keys_in: the KeyComparisonError of keys(namespace).
    m = MAPS[map_impl]()
    m.put("k", "ns", [1])
    with pytest.raises(KeyComparisonError) as caught:
        list(m.keys(_RaisingEq()))
    assert str(caught.value) == (
        "expected comparing ('k', RaisingEq()) with the mapped keys (__eq__) to return "
        "a bool, got RuntimeError: eq broke; the map is unchanged"
    )
    assert isinstance(caught.value.__cause__, RuntimeError)


@pytest.mark.kills(module="cowstate.map_contract")
@pytest.mark.skipif(
    "c" not in MAPS, reason="the C map is not built (test_implementations.py fails)"
)
def test_the_c_map_names_a_copy_that_changed_the_map() -> None:
    # map_contract.reentrant_message, as the C map calls it (rule d of _cmap.c's
    # header), when serializer.copy -- user code -- changes the map it copies
    # for; both maps are held to it by tests/test_user_code_errors.py (rule R2).
    m = MAPS["c"]()

    class ChangesTheMap:
        def copy(self, state: Any) -> Any:
            m.put(99, "ns", [0])
            return list(state)

        def serialize(self, state: Any) -> bytes:
            raise NotImplementedError

        def deserialize(self, data: bytes) -> Any:
            raise NotImplementedError

    m.put(1, "ns", [1])
    snapshot = m.snapshot()
    m.serializer = ChangesTheMap()
    with pytest.raises(ConcurrentModificationError) as caught:
        m.get(1, "ns")
    assert str(caught.value) == (
        "expected serializer.copy not to change the map it was called from, but the map "
        "changed; nothing was written"
    )
    m.release(snapshot)
